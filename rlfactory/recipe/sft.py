"""The `sft:` section of a recipe: a supervised warm-up run by `rlfactory sft RECIPE` (code in rlfactory/warmup/)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlfactory.recipe.section import Section
from rlfactory.recipe.tools import ServerArgs, ToolsConfig


class ScratchVisionConfig(Section):
    """The vision tower of a Qwen3-VL trained from scratch (16-pixel patches, 2x2 merge: one image token per 32x32
    pixels; images resized to between 1 and 64 tokens, as `tiny-random-vl`'s processor does)."""

    hidden_size: int = Field(64, ge=8)
    """Width of the vision blocks (their MLP is twice as wide)."""
    depth: int = Field(2, ge=1)
    """Vision blocks."""
    num_heads: int = Field(2, ge=1)
    """Attention heads of a vision block; must divide hidden_size."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "ScratchVisionConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        return self


class ScratchModelConfig(Section):
    """Shape of a Qwen3 model trained from scratch (the vocabulary size comes from the tokenizer)."""

    hidden_size: int = Field(256, ge=8)
    """Width of the residual stream."""
    num_hidden_layers: int = Field(4, ge=1)
    """Transformer blocks."""
    num_attention_heads: int = Field(4, ge=1)
    """Query heads."""
    num_key_value_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention); must divide num_attention_heads."""
    head_dim: int = Field(64, ge=8)
    """Width of one attention head (Qwen3 sets it on its own: heads x head_dim need not equal hidden_size)."""
    intermediate_size: int = Field(768, ge=8)
    """Width of the MLP."""
    max_position_embeddings: int = Field(1024, ge=16)
    """Longest sequence (prompt + response) the model is built for."""
    vision: ScratchVisionConfig | None = None
    """Set: a Qwen3-VL (this text stack under a vision tower) that reads the images tools return, with a tokenizer
    holding Qwen-VL's image tokens and the Qwen3-VL chat template; unset: a text-only Qwen3."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "ScratchModelConfig":
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads ({self.num_key_value_heads}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        return self


class TokenizerBuildConfig(Section):
    """A byte-level BPE trained on the demonstrations (see rlfactory/warmup/tokenizer_builder.py)."""

    vocab_size: int = Field(640, ge=300)
    """Upper bound on the vocabulary (256 bytes + merges + special tokens)."""
    min_frequency: int = Field(2, ge=1)
    """A merge needs a pair seen this often."""
    environment_words: bool = False
    """Make every word the environment shows (in user and tool turns, seen `min_frequency` times, and not in the
    system turn) one token with its leading space, added beside the merges. A name is then the same tokens wherever
    it appears (goal line, crafting list, an answer, the policy's own action), so copying it is copying tokens; merges
    that span spaces would spell it differently by context."""
    bare_words: bool = False
    """With `environment_words`: capitalised words too, and each name (a capitalised word of 3 letters or more) also
    without its leading space, for a name after a bracket or a quote. For pages that quote names (`link 'Cobalt
    Mug'`) and actions that bracket them (`type [10] [Cobalt Mug]`): a name's words after its first are then the
    same ids wherever it stands."""
    name_space: Literal["leading", "trailing"] = "leading"
    """With `bare_words`, where a name word keeps its space: `leading` (' Alpine'; the name's first word bare after a
    bracket or a quote, so a copied name's first word is other ids than its source's) or `trailing` ('Cobalt ',
    'Alpine ', and each bare for a name's last word): a whole name is then the same ids after a space, a bracket or
    a quote, so copying it is copying every one of its tokens."""

    @model_validator(mode="after")
    def _bare_needs_words(self) -> "TokenizerBuildConfig":
        if self.bare_words and not self.environment_words:
            raise ValueError("tokenizer.bare_words changes how environment words are added: set "
                             "tokenizer.environment_words: true too")
        if self.name_space != "leading" and not self.bare_words:
            raise ValueError("tokenizer.name_space places the space of bare_words' names: set "
                             "tokenizer.bare_words: true too")
        return self


class DemoSetConfig(Section):
    """One set of demonstrations, generated through the recipe's real tools by a scripted policy."""

    name: str
    """Name phases refer to in `data`."""
    n: int = Field(ge=1)
    """Demonstrations to generate."""
    direct_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Share of demonstrations that answer directly instead of calling the tool."""
    seed: int = 0
    """Seed for the generated tasks and for which ones answer directly."""
    tasks_file: str | None = None
    """JSONL tasks (prompt/answer/id) to demonstrate, relative to the recipe; empty = generated arithmetic tasks."""
    digits: list[int] = Field(default_factory=lambda: [3, 4])
    """Operand digit counts of generated arithmetic tasks."""
    policy: Literal["calculator", "textcraft", "babyai", "web"] = "calculator"
    """The scripted demonstrator: `calculator` (arithmetic tasks, the calculator tool) or an environment solver
    that plays `tasks_file`'s tasks through the environment's server (rlfactory/warmup/env_demos.py)."""
    tool: str = "calculator"
    """The calculator demonstrator's tool: `calculator` (the result as text) or any tool taking the same
    `expression`, e.g. the digits_image server's `calculator_picture`, whose result is only in the picture it returns
    (the demonstration then answers the task's reference answer, which the picture shows)."""
    styles: dict[str, float] = Field(default_factory=dict)
    """Environment demonstrators: weights of their styles (textcraft: plan; babyai: walk, macro); empty = the
    first style only."""
    mcp_configs: list[str] | None = None
    """Environment demonstrators: `mcpServers` files (relative to the recipe) to play this set through instead of
    `tools.mcp_configs`, with the same server names, so the transcripts show the same tools (e.g.
    ../mcp_configs/textcraft_shuffled.json: TextCraft with every episode's items renamed); empty = the recipe's."""
    server_args: ServerArgs | None = None
    """Environment demonstrators: arguments added to this set's servers' command lines, by server name, after the
    recipe's `tools.server_args` (e.g. `{web: [--seed, 3]}`: the same web server at another content seed, so other
    products and prices behind the same tools); empty = none."""
    max_turns: int | None = Field(None, ge=2)
    """Environment demonstrators: turns an episode may take (as the rollout horizon counts them); empty = the
    recipe's largest horizon. Longer episodes are dropped."""

    def tools_for(self, tools: ToolsConfig) -> ToolsConfig:
        """The recipe's `tools:` as this set plays through them: its own `mcp_configs` and `server_args`, if any."""
        update: dict[str, object] = {}
        if self.mcp_configs:
            update["mcp_configs"] = list(self.mcp_configs)
        if self.server_args:
            merged = {k: list(v) for k, v in tools.server_args.items()}
            for name, extra in self.server_args.items():
                merged[name] = merged.get(name, []) + list(extra)
            update["server_args"] = merged
        return tools.model_copy(update=update) if update else tools

    @model_validator(mode="after")
    def _env_policy_needs_tasks(self) -> "DemoSetConfig":
        if self.policy != "calculator" and not self.tasks_file:
            raise ValueError(f"policy {self.policy!r} plays environment tasks: set tasks_file (e.g. "
                             f"pkg://rlfactory.envs.tools/data/tasks/{self.policy}_agentgym_train.jsonl)")
        if self.policy == "calculator" and self.styles:
            raise ValueError("styles are for environment demonstrators; the calculator uses direct_fraction")
        if self.policy != "calculator" and self.tool != "calculator":
            raise ValueError("tool is the calculator demonstrator's; environment demonstrators call their server's "
                             "step tool")
        return self


class SFTPhase(Section):
    """One phase of the warm-up: its data, length and learning rate."""

    data: str | list[str]
    """A demo-set name from `sft.demos`, or a JSONL transcript file (relative to the recipe); or a list of them,
    whose transcripts the phase draws from as one shuffled pool."""
    steps: int = Field(ge=1)
    """Optimizer steps in this phase."""
    lr: float = Field(gt=0.0)
    """Peak learning rate."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 to `lr` over the first steps of the phase."""
    max_turns: int | None = Field(None, ge=1)
    """Train on each transcript cut after its first `max_turns` policy turns (empty: whole). Shorter rows make cheaper
    steps that put all of a step on the first turns: e.g. a first phase of `max_turns: 1` on what the first action
    copies from the task (a name), then whole transcripts. Not for transcripts with images."""
    loss_turns: Literal["all", "last"] = "all"
    """Which policy turns carry the loss: `all`, or `last`: only each transcript's final policy turn (after a
    `max_turns` cut, the N-th), with the whole transcript before it as context. A last turn that reads a value off the
    last page (an answer) is a few tokens among a transcript's ~100 policy tokens; `last` gives a step's gradient to
    it alone."""

    @property
    def sources(self) -> list[str]:
        """The phase's demo sets and files, as a list."""
        return [self.data] if isinstance(self.data, str) else list(self.data)


class SFTCheckConfig(Section):
    """Rollouts through the real tools after training, to tell whether the warm-up is a usable start for GRPO."""

    tasks: int = Field(64, ge=0)
    """Validation tasks to roll out (0 = skip the check)."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature (the GRPO recipe's, to see the start GRPO will see)."""
    split: Literal["val", "train"] = "val"
    """Tasks to roll out: `val` (data.val_file, how the start does on tasks it has not seen) or `train`
    (data.train_file, the tasks GRPO's groups will come from)."""
    min_call_accuracy: float = Field(0.5, ge=0.0, le=1.0)
    """Of the trajectories that call a tool, the share whose first call is exactly right must reach this."""
    min_copy_accuracy: float = Field(0.5, ge=0.0, le=1.0)
    """Of the trajectories whose call succeeded, the share that answers with the tool's result must reach this."""


class SFTConfig(Section):
    """The `sft:` section: a supervised warm-up that writes an HF model folder (e.g. the quickstart's checkpoint)."""

    output_dir: str
    """Model folder to write (config, bf16 safetensors, tokenizer, chat template), relative to the recipe."""
    init: Literal["scratch", "model"] = "scratch"
    """`scratch`: build a new tokenizer and Qwen3 model; `model`: continue from the recipe's `model.path`."""
    scratch_model: ScratchModelConfig = Field(default_factory=ScratchModelConfig)
    """Model shape when init is `scratch`."""
    tokenizer: TokenizerBuildConfig = Field(default_factory=TokenizerBuildConfig)
    """Tokenizer built when init is `scratch`."""
    demos: list[DemoSetConfig] = Field(default_factory=list)
    """Demonstration sets generated through the recipe's tools before training."""
    phases: list[SFTPhase] = Field(min_length=1)
    """Training phases, run in order."""
    batch_size: int = Field(16, ge=1)
    """Transcripts per optimizer step."""
    grad_clip: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this (empty = no clipping)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    seed: int = 0
    """Seed for initialisation, demonstrations' order and batches."""
    torch_threads: int = Field(1, ge=1)
    """torch CPU threads (1 measured fastest on a 2-core machine)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where training and the check run: `auto` is a GPU when torch sees one, else the CPU. The folder is the same
    either way (bf16 weights); a GPU run is not bit-identical to a CPU run of the same recipe."""
    work_dir: str = "runs/sft"
    """Where demonstrations and the run's log go (relative to the working directory)."""
    check: SFTCheckConfig = Field(default_factory=SFTCheckConfig)
    """The usable-start check run after training."""

    @model_validator(mode="after")
    def _phase_data_known(self) -> "SFTConfig":
        names = {d.name for d in self.demos}
        if len(names) != len(self.demos):
            raise ValueError("sft.demos: demo-set names must be unique")
        for i, p in enumerate(self.phases):
            if not p.sources:
                raise ValueError(f"sft.phases.{i}.data: an empty list; name at least one demo set or .jsonl file")
            for src in p.sources:
                if src not in names and not src.endswith(".jsonl"):
                    raise ValueError(f"sft.phases.{i}.data: {src!r} is neither a demo-set name "
                                     f"({', '.join(sorted(names)) or 'none defined'}) nor a .jsonl file")
            if p.max_turns is not None and self.scratch_model.vision is not None:
                raise ValueError(f"sft.phases.{i}.max_turns: a vision-language warm-up's transcripts hold images, "
                                 "which a cut would split from their placeholders; remove max_turns")
        return self
