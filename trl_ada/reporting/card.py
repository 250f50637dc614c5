"""The Reinforce-Ada model card: TRL's card metadata, our template (`hub_cards/`), statistics from the run."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import fields
from importlib import resources
from importlib.metadata import PackageNotFoundError, metadata, version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..samplers import SamplerSettings
from ..samplers.base import describe
from ..samplers.settings import KNOB_FIELDS, UNIVERSAL_KNOBS, option_fields
from .plots import PLOT_CAPTIONS, logged_mean, logged_series, training_entries, write_metrics, write_training_plots

TEMPLATE = "reinforce_ada_model_card.md"

SYNC_TRAINER_NAME = "Reinforce-Ada (trl-ada's AdaGRPOTrainer)"
ASYNC_TRAINER_NAME = "Reinforce-Ada (trl-ada's AdaAsyncGRPOTrainer, on TRL's asynchronous GRPO trainer)"
"""How the card names the trainer that wrote it."""

_FINAL_METRICS = (
    "reward",
    "ada/pool_reward/mean",
    "ada/samples_per_prompt/mean",
    "ada/zero_variance_share/first_n",
    "ada/zero_variance_share/kept",
    "loss",
    "entropy",
    "completions/mean_length",
)


def sampler_rows(settings: SamplerSettings) -> list[tuple[str, Any]]:
    """The knobs that matter for this configuration, as `(name, value)` rows: the basics, every other knob it reads
    that is set, the weight knobs unless the objective is linear (every weight is 1 then), and the sampler's options."""
    basics = ["sampler", "num_generations", "positive_threshold", "baseline", "scale_rewards"]
    weights = ["max_weight", "normalize_weights"]
    linear = settings.reads("objective") and settings.objective == "linear"
    names = basics + [
        f.name
        for f in fields(settings)
        if f.name not in UNIVERSAL_KNOBS and settings.reads(f.name) and getattr(settings, f.name) is not None
    ]
    names += [] if linear else weights
    rows = [(name, getattr(settings, name)) for name in names]
    options = settings.options
    rows += [
        (f"sampler_kwargs.{name}", getattr(options, name))
        for name in option_fields(type(options))
        if name not in KNOB_FIELDS
    ]
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def run_statistics(log_history: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Averages of the Reinforce-Ada metrics over the logged training steps (those that logged a number), formatted
    for the card."""
    entries = training_entries(log_history)
    samples_max = max((value for _, value in logged_series(entries, "ada/samples_per_prompt/max")), default=None)
    return {
        "ada_steps": str(entries[-1]["step"] if entries else 0),
        "ada_logged_steps": len(entries),
        "ada_samples_mean": _fmt(logged_mean(entries, "ada/samples_per_prompt/mean")),
        "ada_samples_max": _fmt(samples_max),
        "ada_rounds_mean": _fmt(logged_mean(entries, "ada/rounds")),
        "ada_zero_first": _fmt(logged_mean(entries, "ada/zero_variance_share/first_n")),
        "ada_zero_kept": _fmt(logged_mean(entries, "ada/zero_variance_share/kept")),
        "ada_pass_rate": _fmt(logged_mean(entries, "ada/pass_rate/mean")),
    }


def final_metrics(log_history: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The last training step's headline metrics, then every evaluation metric of the last evaluation (`None` and NaN
    shown as `n/a`)."""
    entries = training_entries(log_history)
    rows = [(key, _fmt(entries[-1][key])) for key in _FINAL_METRICS if entries and key in entries[-1]]
    evaluations = [e for e in log_history if any(k.startswith("eval_") for k in e)]
    if evaluations:
        rows += [(k, _fmt(v)) for k, v in evaluations[-1].items() if k.startswith("eval_")]
    return rows


def package_url(distribution: str = "trl-ada") -> str | None:
    """The home page an installed distribution declares in its metadata (`Home-page`, else its first `Project-URL`),
    or `None`: the card links only an address the package itself names."""
    try:
        fields = metadata(distribution)
    except PackageNotFoundError:
        return None
    home_page = fields.get("Home-page")
    if home_page and home_page.strip().upper() != "UNKNOWN":
        return home_page.strip()
    for entry in fields.get_all("Project-URL") or []:  # "Label, https://..."
        url = entry.split(",", 1)[-1].strip()
        if url:
            return url
    return None


_HUB_CACHE_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+)--([^/]+)/snapshots/[^/]+/?$")
"""A model directory inside the Hugging Face cache: `.../models--{org}--{name}/snapshots/{revision}`."""


def hub_id_of(name_or_path: str) -> str | None:
    """The Hub id a model was loaded from: the name itself when it is no local directory (as TRL decides), the id a
    directory of the Hugging Face cache is a snapshot of, else `None`."""
    if not Path(name_or_path).is_dir():
        return name_or_path
    snapshot = _HUB_CACHE_SNAPSHOT.search(Path(name_or_path).resolve().as_posix())
    return f"{snapshot.group(1)}/{snapshot.group(2)}" if snapshot else None


def declared_license(name_or_path: str | None) -> str | None:
    """The `license` a base model's own card declares (a fine-tuned model inherits it), read only from disk: its
    directory, or the Hugging Face cache for a Hub id; `None` when no card is at hand."""
    from huggingface_hub import try_to_load_from_cache

    if not name_or_path:
        return None
    readme = Path(name_or_path) / "README.md"
    if not Path(name_or_path).is_dir():
        cached = try_to_load_from_cache(name_or_path, "README.md")
        readme = Path(cached) if isinstance(cached, str) else None
    if readme is None or not readme.is_file():
        return None
    try:
        license_id = ModelCard.load(readme).data.license
    except (OSError, ValueError):
        return None
    return license_id if isinstance(license_id, str) and license_id else None


def is_local_path(name: str) -> bool:
    """Whether a dataset name is a local file or directory (named in the text, never in the Hub metadata)."""
    return Path(name).expanduser().exists()


def describe_training_data(dataset_names: str | Sequence[str] | None, description: str | None = None) -> str | None:
    """The card's words for the training data: the datasets named (Hub ids linked, local files by their file name),
    else the training dataset's own `info.description` (the embedded arithmetic task sets one), else `None`."""
    names = [dataset_names] if isinstance(dataset_names, str) else list(dataset_names or [])
    if not names:
        return description or None
    parts = [
        f"`{Path(name).expanduser().name}` (a local file)"
        if is_local_path(name)
        else f"[{name}](https://huggingface.co/datasets/{name})"
        for name in names
    ]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"
    return f"the dataset{'s' if len(parts) > 1 else ''} {listed}"


HUB_LICENSES: frozenset[str] = frozenset(
    """
    apache-2.0 mit openrail openrail++ creativeml-openrail-m bigscience-openrail-m bigscience-bloom-rail-1.0
    bigcode-openrail-m afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0
    cc-by-2.0 cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0
    cc-by-nd-4.0 cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0
    cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 eupl-1.2 agpl-3.0 gfdl
    gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 lgpl-lr isc h-research intel-research lppl-1.3c ms-pl apple-ascl
    apple-amlr mpl-2.0 odc-by odbl openmdw-1.0 openmdw-1.1 osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl
    deepfloyd-if-license fair-noncommercial-research-license grok2-community llama2 llama3 llama3.1 llama3.2 llama3.3
    llama4 gemma unknown other
    """.split()
)
"""The license ids the Hub takes in a card's `license` (its licenses page and the models filter); any other license is
`other`, with `license_name` and `license_link`."""


def check_license(license_id: str | None) -> None:
    """Refuses a `license` the Hub would not take ([`HUB_LICENSES`]), before anything is written."""
    if license_id is None:
        return
    if not isinstance(license_id, str) or license_id not in HUB_LICENSES:
        close = difflib.get_close_matches(str(license_id).lower(), sorted(HUB_LICENSES), n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"license={license_id!r} is not a Hub license id.{hint} Pass one such as 'apache-2.0', 'mit' or "
            "'cc-by-4.0' (the list: https://huggingface.co/docs/hub/repositories-licenses), or 'other' for any "
            "other license."
        )


def hub_metadata(
    card_data: ModelCardData,
    base_model_name_or_path: str | None,
    dataset_names: str | Sequence[str] | None,
    license: str | None = None,
) -> ModelCardData:
    """The card's front matter: TRL's, with the Hub ids the run knows (`base_model`, also from the Hugging Face cache;
    every Hub dataset) and no local path (the Hub rejects them), `pipeline_tag: text-generation`, and the `license`
    given, else the base model's own when its card is on disk (never TRL's `licence: license` placeholder)."""
    check_license(license)
    values = {key: value for key, value in card_data.to_dict().items() if key not in ("licence", "license")}
    base_model = hub_id_of(base_model_name_or_path) if base_model_name_or_path else card_data.base_model
    names = [dataset_names] if isinstance(dataset_names, str) else list(dataset_names or [])
    datasets = [name for name in names if not is_local_path(name)]
    values.update(
        base_model=base_model,
        datasets=datasets or None,
        license=license or declared_license(base_model_name_or_path or base_model),
        pipeline_tag="text-generation",
    )
    return ModelCardData(**{key: value for key, value in values.items() if value is not None})


def describe_base_model(card_data: ModelCardData, base_model_name_or_path: str | None) -> dict[str, str | None]:
    """How the card names the model the run started from, as the template's `base_model*` variables: `base_model`, a
    Hub id (also a Hugging Face cache snapshot's); `base_model_shipped`, trl-ada's tiny model; `base_model_path`, any
    other local directory (named in the text only: the Hub takes only ids in the metadata)."""
    name = base_model_name_or_path or card_data.base_model
    described: dict[str, str | None] = {"base_model": None, "base_model_shipped": None, "base_model_path": None}
    if not name:
        return described
    if hub_id_of(name) is not None:
        described["base_model"] = hub_id_of(name)
        return described
    from ..tiny import TINY_ARITH_ASSETS, TINY_ARITH_VERSION

    if Path(name).resolve() == TINY_ARITH_ASSETS.resolve():
        described["base_model_shipped"] = TINY_ARITH_VERSION
    else:
        described["base_model_path"] = Path(name).resolve().as_posix()
    return described


def describe_rollouts(
    *,
    tools: Sequence[Any] | None = None,
    environment_factories: dict[str, Any] | None = None,
    rollout_func: Any = None,
    vision: bool = False,
) -> list[str]:
    """The card's phrases for how completions were produced beyond a single generate call, from GRPOTrainer's
    attributes of those names (each shown by its `__name__`) and whether the model is a vision-language model."""
    tool_names = [getattr(tool, "__name__", str(tool)) for tool in tools or []]
    environment_names = sorted(
        {getattr(factory, "__name__", str(factory)) for factory in (environment_factories or {}).values()}
    )
    rollout_func_name = getattr(rollout_func, "__name__", None) if rollout_func else None
    phrases = []
    if tool_names:
        phrases.append(
            f"tool calls ({', '.join(f'`{name}`' for name in tool_names)}) in TRL's tool loop, tool output masked out "
            "of the loss"
        )
    if environment_names:
        phrases.append(
            f"environment episodes ({', '.join(f'`{name}`' for name in environment_names)}), one fresh `reset` per "
            "completion drawn, scored when the episode ended"
        )
    if rollout_func_name:
        phrases.append(f"a custom rollout function (`{rollout_func_name}`)")
    if vision:
        phrases.append("image prompts (a vision-language model)")
    return phrases


def render_model_card(
    card_data: ModelCardData,
    *,
    settings: SamplerSettings,
    log_history: Sequence[dict[str, Any]],
    plots: Sequence[tuple[str, Path]],
    output_dir: str | Path,
    model_name: str | None,
    hub_model_id: str | None,
    paper: dict[str, str],
    example_prompt: str = "What is 12+35?",
    example_max_new_tokens: int = 64,
    base_model_name_or_path: str | None = None,
    rollouts: Sequence[str] = (),
    trainer_name: str = SYNC_TRAINER_NAME,
    trainer_settings: Sequence[tuple[str, Any]] = (),
    data_description: str | None = None,
    reward_names: Sequence[str] = (),
    license: str | None = None,
) -> ModelCard:
    """A `ModelCard` from `hub_cards/reinforce_ada_model_card.md`, with TRL's metadata completed by [`hub_metadata`].

    Args:
        card_data: TRL's metadata; its `datasets` are the run's `dataset_name` (Hub ids, local paths, or a list).
        base_model_name_or_path: What the run's model was loaded from. Default: TRL's `card_data.base_model`.
        hub_model_id, output_dir: The quick start loads the model from the Hub repository it is pushed to, else by
            its output folder's name (never an absolute path).
        rollouts: What each completion was besides one generate call, one phrase each ([`describe_rollouts`]).
        data_description: The training data's own description, used when `card_data` names no dataset.
        license: The model's Hub license id; default: the base model's, when its card is on disk, else none.
    """
    template = resources.files("trl_ada.hub_cards").joinpath(TEMPLATE)
    return ModelCard.from_template(
        hub_metadata(card_data, base_model_name_or_path, card_data.datasets, license),
        template_path=str(template),
        model_name=model_name or card_data.model_name,
        **describe_base_model(card_data, base_model_name_or_path),
        hub_model_id=hub_model_id,
        local_model_name=Path(output_dir).resolve().name,
        training_data=describe_training_data(card_data.datasets, data_description),
        reward_names=list(reward_names),
        sampler_description=describe(settings),
        trainer_name=trainer_name,
        trainer_citation=paper.get("citation"),
        paper_title=paper.get("title"),
        paper_id=paper.get("id"),
        example_prompt=example_prompt.replace('"', '\\"'),
        example_max_new_tokens=example_max_new_tokens,
        ada_settings=[(name, _fmt(value)) for name, value in [*sampler_rows(settings), *trainer_settings]],
        final_metrics=final_metrics(log_history),
        plots=[
            (title, Path(path).relative_to(output_dir).as_posix(), PLOT_CAPTIONS.get(Path(path).stem, ""))
            for title, path in plots
        ],
        trl_ada_version=version("trl-ada"),
        trl_ada_url=package_url(),
        trl_version=version("trl"),
        transformers_version=version("transformers"),
        pytorch_version=version("torch"),
        datasets_version=version("datasets"),
        tokenizers_version=version("tokenizers"),
        rollouts=list(rollouts),
        **run_statistics(log_history),
    )


def write_trainer_card(
    trainer: Any,
    settings: SamplerSettings,
    *,
    model_name: str | None,
    trainer_name: str = SYNC_TRAINER_NAME,
    rollouts: Sequence[str] = (),
    license: str | None = None,
) -> ModelCard:
    """Replace the `README.md` TRL wrote into a trainer's output folder (after its run, on the main process) with
    trl-ada's card ([`render_model_card`]), keeping TRL's metadata, and write the logged metrics (`metrics.json`,
    `metrics.csv`) and the training plots (`plots/`) it shows next to it; returns the card written. The trainer's
    knobs that change what is trained (`train_on`, the asynchronous trainer's) are shown after the sampler's.
    """
    from datasets import Dataset, IterableDataset

    from ..trl_seam.grpo_private import get_config_model_id

    check_license(license)
    args = trainer.args
    trainer_settings = [("train_on", args.train_on)]
    if trainer_name == ASYNC_TRAINER_NAME:
        from ..async_grpo.async_grpo_config import ASYNC_ONLY_FIELDS

        trainer_settings += [(name, getattr(args, name)) for name in ASYNC_ONLY_FIELDS]
    output_dir = Path(args.output_dir)
    log_history = trainer.state.log_history
    trl_card = ModelCard.load(output_dir / "README.md")
    write_metrics(log_history, output_dir)
    plots = write_training_plots(log_history, output_dir)
    train_dataset = trainer.train_dataset
    example = train_dataset[0].get("prompt") if isinstance(train_dataset, Dataset) else None
    info = train_dataset.info if isinstance(train_dataset, (Dataset, IterableDataset)) else None
    card = render_model_card(
        trl_card.data,
        settings=settings,
        log_history=log_history,
        plots=plots,
        output_dir=output_dir,
        model_name=model_name,
        hub_model_id=trainer.hub_model_id,
        base_model_name_or_path=get_config_model_id(trainer.accelerator.unwrap_model(trainer.model).config),
        paper=trainer._paper,
        **({"example_prompt": example} if isinstance(example, str) else {}),
        example_max_new_tokens=args.max_completion_length or 64,
        rollouts=rollouts,
        trainer_name=trainer_name,
        trainer_settings=trainer_settings,
        data_description=info.description if info is not None else None,
        reward_names=getattr(trainer, "reward_func_names", ()),
        license=license,
    )
    card.save(output_dir / "README.md")
    return card
