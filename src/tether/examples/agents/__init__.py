"""The example agents; importing the package registers them."""

from . import assistant, long_writer, note_writer, pydantic_writer

__all__ = ["assistant", "long_writer", "note_writer", "pydantic_writer"]
