"""Real MCP and OAuth servers for the MCP tests, started by the tests on loopback."""
