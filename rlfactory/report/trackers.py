"""Experiment trackers a run's metrics go to besides metrics.jsonl: TensorBoard, Weights & Biases, MLflow, Trackio.

Each one is the library's own API (torch's SummaryWriter, `wandb.init` / `run.log`, `MlflowClient.log_batch`,
`trackio.init` / `trackio.log`), fed the same rows as metrics.jsonl, so every tracker sees the same names and values
in both engines. Selection and names come from the recipe (`trainer.loggers`, `trainer.tracking`):
- wandb runs offline (files under RUN/wandb) unless `trainer.tracking.wandb_mode: online` or WANDB_MODE says else;
- MLflow logs to a local file store (RUN/mlruns) unless `trainer.tracking.mlflow_tracking_uri` names a server or
  database;
- the ids of the wandb and MLflow runs are kept in RUN/trackers.json, so `--resume` continues the same runs.

A tracker that fails at start-up stops the run before any step (a typo in a server address should not cost a run);
one that fails later is logged and dropped, and training goes on: metrics.jsonl stays complete either way.
Left out: artifacts, media, system metrics.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlfactory.errors import RLFactoryError

if TYPE_CHECKING:  # the type only: the dashboard and report read run folders without loading the schema
    from rlfactory.recipe.schema import Recipe

logger = logging.getLogger(__name__)

# logger name -> (the module it imports, the pip extra that installs it)
PACKAGES = {"tensorboard": ("tensorboard", None), "wandb": ("wandb", "trackers"),
            "mlflow": ("mlflow", "trackers"), "trackio": ("trackio", "trackio")}


class Tracker(Protocol):
    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row, without `step` (what every tracker records)."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # ~1 s; only when TensorBoard is on

        # purge_step drops events a killed run wrote past its last checkpoint.
        self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, ids: dict[str, str], *, project: str, run_name: str, tags: list[str],
                 config: dict[str, Any], mode: str | None):
        import wandb

        mode = os.environ.get("WANDB_MODE") or mode or "offline"
        self.run = wandb.init(project=project, name=run_name, tags=tags or None, config=config, dir=str(run_dir),
                              mode=mode, id=ids.get("wandb"), resume="allow" if ids.get("wandb") else None,
                              reinit="create_new")
        ids["wandb"] = self.run.id

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, ids: dict[str, str], *, project: str, run_name: str, tags: list[str],
                 config: dict[str, Any], uri: str | None):
        from mlflow.tracking import MlflowClient

        if uri is None:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 refuses the file store unless asked: a run folder's own store is what is wanted here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        run_id = ids.get("mlflow")
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
            run = self.client.create_run(exp_id, run_name=run_name, tags={t: "" for t in tags})
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=_params(config))
        self.run_id = ids["mlflow"] = run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """Trackio keeps runs in its own local database (TRACKIO_DIR, by default under ~/.cache/huggingface), not the
    run folder; `trackio show` opens it. A run of the same name is continued (resume='allow')."""

    name = "trackio"

    def __init__(self, run_dir: Path, *, project: str, run_name: str, config: dict[str, Any]):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=project, name=run_name, config=config, resume="allow")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.trackio.log(metrics, step=step)

    def close(self) -> None:
        self.trackio.finish()


def _params(config: dict[str, Any], prefix: str = "") -> list[Any]:
    """The recipe as MLflow params (flattened dotted keys; MLflow caps a value at 6000 characters)."""
    from mlflow.entities import Param

    out: list[Any] = []
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(_params(v, key + "."))
        else:
            out.append(Param(key, json.dumps(v)[:6000]))
    return out[:100]  # MLflow's limit per batch; the recipe itself is RUN/recipe.yaml


def missing_packages(loggers: list[str]) -> list[str]:
    """One message per logger whose package is not installed, naming the extra that installs it."""
    import importlib.util

    out = []
    for name in loggers:
        module, extra = PACKAGES.get(name, (None, None))
        if module and importlib.util.find_spec(module) is None:
            how = f"pip install 'rlfactory[{extra}]'" if extra else f"pip install {module}"
            out.append(f"trainer.loggers: `{name}` needs the `{module}` package, which is not installed ({how})")
    return out


def open_trackers(recipe: Recipe, run_dir: str | Path, *, purge_step: int | None = None,
                  exclude: tuple[str, ...] = ()) -> list[Tracker]:
    """The trackers `recipe.trainer` asks for (all but `jsonl`, which MetricsLog writes itself, and `exclude`)."""
    run = Path(run_dir)
    t = recipe.trainer
    names = [n for n in t.effective_loggers() if n != "jsonl" and n not in exclude]
    if t.loggers is None and "tensorboard" in names and missing_packages(["tensorboard"]):
        logger.warning("tensorboard is not installed: metrics go to metrics.jsonl only")
        names.remove("tensorboard")
    problems = missing_packages(names)
    if problems:
        raise RLFactoryError("; ".join(problems))
    if not names:
        return []
    tr = t.tracking
    project = tr.project or recipe.name or "rlfactory"
    run_name = tr.run_name or run.resolve().name
    config = recipe.model_dump(mode="json")
    ids_path = run / "trackers.json"
    ids: dict[str, str] = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
    opened: list[Tracker] = []
    try:
        for name in names:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(run, purge_step))
            elif name == "wandb":
                opened.append(WandbTracker(run, ids, project=project, run_name=run_name, tags=tr.tags,
                                           config=config, mode=tr.wandb_mode))
            elif name == "mlflow":
                opened.append(MlflowTracker(run, ids, project=project, run_name=run_name, tags=tr.tags,
                                            config=config, uri=tr.mlflow_tracking_uri))
            elif name == "trackio":
                opened.append(TrackioTracker(run, project=project, run_name=run_name, config=config))
    except RLFactoryError:
        close_all(opened)
        raise
    except Exception as e:
        close_all(opened)
        raise RLFactoryError(f"trainer.loggers: `{name}` could not start: {e!r} (check trainer.tracking, or "
                             f"remove `{name}` from trainer.loggers)") from e
    if ids:
        run.mkdir(parents=True, exist_ok=True)
        ids_path.write_text(json.dumps(ids, indent=1))
    logger.info("metrics go to metrics.jsonl and %s", ", ".join(names))
    return opened


def close_all(trackers: list[Tracker]) -> None:
    for tracker in trackers:
        try:
            tracker.close()
        except Exception as e:  # closing one must not keep the others open
            logger.warning("closing the %s tracker failed: %r", tracker.name, e)
