"""PydanticAI agents with durable turns (the ``tether[pydantic-ai]`` extra).

```python
from pydantic_ai import Agent
from tether import ChatAgentClassRegistry
from tether.integrations.pydantic_ai import PydanticAIChatAgent

@ChatAgentClassRegistry.register()
class Support(PydanticAIChatAgent):
    agent_name = "support"
    agent = Agent("openai:gpt-4.1", tools=[...])
```

See ``docs/pydantic-ai.md``.
"""

from tether.integrations.pydantic_ai._durable_tools import ON_UNKNOWN_KEY, DurableTools
from tether.integrations.pydantic_ai.agent import PydanticAIChatAgent
from tether.integrations.pydantic_ai.offline_model import OfflineModel
from tether.integrations.pydantic_ai.run_state import PydanticAIRun, PydanticAIRunFactory

__all__ = [
    "ON_UNKNOWN_KEY",
    "DurableTools",
    "OfflineModel",
    "PydanticAIChatAgent",
    "PydanticAIRun",
    "PydanticAIRunFactory",
]
