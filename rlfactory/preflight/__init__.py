"""Recipe validation before any work: every problem of a recipe at once, each message naming the file and the
dotted field (`rlfactory validate`, and the first thing `train`, `sft` and `eval` do).

recipe_check.py (the whole check, field errors, rewards), model_checks.py, data_files.py, services.py (tool servers,
cache). Starts no tool server and loads no model weights.
"""
from rlfactory.preflight.recipe_check import RecipeCheck, check_loaded_recipe, check_recipe, validate_recipe

__all__ = ["RecipeCheck", "check_loaded_recipe", "check_recipe", "validate_recipe"]
