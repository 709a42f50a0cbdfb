"""The one base class of every recipe section: unknown keys are errors, and each field's docstring is its help."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A recipe section. `extra="forbid"` turns a typo into an error that names the key; attribute docstrings
    become the field descriptions `rlfactory validate` and the docs show."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
