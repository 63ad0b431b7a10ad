"""``plan()``: will a recipe fit on a job shape, how fast will it run, how long will it take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cookbook.planner.estimate import (
    CHECKPOINTING_MODES,
    MemoryBreakdown,
    Settings,
    effective_mfu,
    estimate_memory,
    flops_per_sample,
    samples_per_second_per_gpu,
    tokens_per_sample,
)
from cookbook.planner.hardware import GIB, GpuSpec, get_gpu
from cookbook.planner.models import FluxShape, ModelShape, get_model
from cookbook.planner.recipes import (
    RECIPES,
    RecipeDefaults,
    ignorable_overrides,
    lora_rank_problem,
    recipe_defaults,
    settings_overrides,
)

if TYPE_CHECKING:
    from cookbook.spec import JobSpec

DEFAULT_MIN_MARGIN = 0.10  # suggest() wants 10% of GPU memory left free


@dataclass(frozen=True)
class Plan:
    recipe: str
    model: ModelShape | FluxShape
    gpu: GpuSpec
    nodes: int
    gpus_per_node: int
    settings: Settings
    memory: MemoryBreakdown
    samples_per_s_per_gpu: float
    dataset_samples: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def capacity_gib(self) -> float:
        return self.gpu.memory_gib

    @property
    def peak_gib(self) -> float:
        return self.memory.total / GIB

    @property
    def live_gib(self) -> float:
        """Peak tensor bytes without allocator overhead (torch "active"; torchtune's peak_memory_active)."""
        return self.memory.live / GIB

    @property
    def margin_gib(self) -> float:
        return self.capacity_gib - self.peak_gib

    @property
    def margin_fraction(self) -> float:
        return self.margin_gib / self.capacity_gib

    @property
    def fits(self) -> bool:
        return self.margin_gib >= 0

    @property
    def unit(self) -> str:
        return "images" if isinstance(self.model, FluxShape) else "tokens"

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Tokens (LLM) or images (FLUX) per second per GPU."""
        if isinstance(self.model, FluxShape):
            return self.samples_per_s_per_gpu
        return self.samples_per_s_per_gpu * tokens_per_sample(self.model, self.settings)

    @property
    def mfu(self) -> float:
        return effective_mfu(self.gpu, self.settings, self.model)

    @property
    def samples_per_step(self) -> int:
        """Global batch: micro-batch x gradient accumulation x data-parallel ranks."""
        dp = max(1, self.world // self.settings.tp)
        return self.settings.micro_batch * self.settings.grad_accum * dp

    @property
    def step_time_s(self) -> float:
        return self.samples_per_step / (self.samples_per_s_per_gpu * self.world)

    @property
    def epoch_time_s(self) -> float | None:
        if self.dataset_samples is None:
            return None
        return self.dataset_samples / (self.samples_per_s_per_gpu * self.world)

    @property
    def gpu_hours(self) -> float | None:
        t = self.epoch_time_s
        return None if t is None else t * self.world / 3600

    def verdict(self) -> str:
        word = "fits" if self.fits else "does not fit"
        return (
            f"{word}: {self.peak_gib:.1f} of {self.capacity_gib:.1f} GiB per GPU "
            f"(margin {self.margin_gib:+.1f} GiB, {100 * self.margin_fraction:+.0f}%)"
        )

    def render(self) -> str:
        s = self.settings
        seq = (
            f"{tokens_per_sample(self.model, s)} tokens/image"
            if isinstance(self.model, FluxShape)
            else f"seq {s.seq_len}"
        )
        lines = [
            f"{self.recipe}: {self.model.name} on {self.nodes} x {self.gpus_per_node} {self.gpu.name}",
            self.verdict(),
            "",
            f"{'memory per GPU':<22}{'GiB':>9}",
            *(f"  {name:<20}{gib:>9.2f}" for name, gib in self.memory.rows_gib()),
            f"  {'total (peak)':<20}{self.peak_gib:>9.2f}   (grads and activations never peak together)",
            f"  {'GPU capacity':<20}{self.capacity_gib:>9.2f}",
            "",
            f"settings: micro-batch {s.micro_batch}, {seq}, grad accum {s.grad_accum}, AC {s.checkpointing}"
            f"{', act. offload' if s.activation_offloading else ''}, TP {s.tp}"
            f"{f', HSDP shard {s.shard_group}' if s.shard_group else ''}"
            f"{f', LoRA rank {s.lora_rank}' if s.lora_rank else ''}"
            f"{', FSDP CPU offload' if s.fsdp_cpu_offload else ''}"
            f"{', compile' if s.compile else ''}, {'fused' if s.fused_optimizer else 'foreach'} AdamW",
            f"throughput: {self.tokens_per_s_per_gpu:,.1f} {self.unit}/s per GPU at {100 * self.mfu:.0f}% MFU "
            f"({self.gpu.mfu_source}); {flops_per_sample(self.model, s) / 1e12:.2f} TFLOP per sample",
            f"step: {self.samples_per_step:,} samples, {self.step_time_s:.2f} s",
        ]
        if self.epoch_time_s is not None:
            lines.append(f"epoch: {self.epoch_time_s / 3600:.2f} h wall, {self.gpu_hours:,.0f} GPU-hours")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def plan(
    recipe: str,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    *,
    dataset_tokens: float | None = None,
    dataset_samples: float | None = None,
    **settings: Any,
) -> Plan:
    """Plan ``recipe`` on ``nodes`` x ``gpus_per_node`` GPUs of kind ``gpu`` (recipe defaults if None).

    ``settings`` are :class:`Settings` fields or the recipe's config keys (``batch_size=8``,
    ``enable_activation_checkpointing=False``); values may be strings as typed on a command line.
    ``dataset_tokens`` (LLM) or ``dataset_samples`` give the time per epoch and GPU-hours.
    """
    defaults = recipe_defaults(recipe)
    nodes = defaults.nodes if nodes is None else int(nodes)
    gpus_per_node = defaults.gpus_per_node if gpus_per_node is None else int(gpus_per_node)
    from cookbook.spec import shape_problems

    if problems := shape_problems(nodes, gpus_per_node):
        raise ValueError(problems[0])
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node={gpus_per_node}: the planner plans GPU jobs; give at least 1 (e.g. 8)")
    spec = get_gpu(gpu or defaults.gpu)
    s = defaults.settings.with_overrides(**settings_overrides(settings))
    s.validate()
    if defaults.settings.lora_rank and s.lora_rank < 1:  # 0 would plan a full fine-tune under the LoRA name
        raise ValueError(f"lora_rank={s.lora_rank}: {recipe} is a LoRA recipe; its rank must be > 0 (e.g. 16)")
    if problem := lora_rank_problem(recipe, settings):
        raise ValueError(problem)
    world = nodes * gpus_per_node
    if world % s.tp:
        raise ValueError(f"tensor-parallel degree {s.tp} does not divide {world} GPUs")
    model = get_model(defaults.model)
    samples = dataset_samples
    if samples is None and dataset_tokens is not None:
        samples = dataset_tokens / tokens_per_sample(model, s)
    notes = [defaults.source]
    if isinstance(model, ModelShape) and model.experts > 1:
        notes.append(
            f"MoE: {model.total_params / 1e9:.1f}B parameters stored, {model.active_params / 1e9:.1f}B"
            " active per token (FLOPs use the active count)"
        )
    return Plan(
        recipe,
        model,
        spec,
        nodes,
        gpus_per_node,
        s,
        estimate_memory(model, s, world),
        samples_per_second_per_gpu(model, s, spec),
        samples,
        tuple(notes),
    )


def fit_warning(
    recipe: str,
    nodes: int | None,
    gpus_per_node: int | None,
    gpu: str | None,
    overrides: Mapping[str, Any] | None = None,
) -> str | None:
    """A one-line warning when ``recipe`` will not fit (or is within 5% of full); None when it fits.

    ``overrides`` may hold any recipe override; keys that do not change memory are ignored, so the
    renderer can pass the user's override dict as is. A recipe the planner has no model for, or an
    override value the engine's own validation reports, gives no warning; an unknown GPU kind raises
    :class:`cookbook.gpus.UnknownGpu` (a mistyped GPU must not read as "fits").
    """
    if recipe not in RECIPES:
        return None
    get_gpu(gpu or RECIPES[recipe].gpu)
    try:
        settings = ignorable_overrides(overrides or {})
        p = plan(recipe, nodes, gpus_per_node, gpu, **settings)
    except ValueError:
        return None
    if not p.fits:
        # the same job shape and memory settings, so the suggestions start from this job
        sets = "".join(
            f" --set {k}={v}" for k, v in settings.items() if k not in ("micro_batch", "tp", "checkpointing")
        )
        hint = (
            f"cookbook plan {recipe} --nodes {p.nodes} --gpus-per-node {p.gpus_per_node} "
            f"--gpu {p.gpu.key}{sets} --suggest"
        )
        return (
            f"planner: {recipe} does not fit on {p.gpu.name}: needs ~{p.peak_gib:.0f} GiB per GPU of "
            f"{p.capacity_gib:.0f} GiB; try `{hint}`"
        )
    if p.margin_fraction < 0.05:
        return f"planner: {recipe} is tight on {p.gpu.name}: {p.verdict()}"
    return None


def job_fit_warning(spec: JobSpec, gpu: str | None = None) -> str | None:
    """:func:`fit_warning` for a job spec (its recipe, shape and overrides) on GPUs of kind ``gpu``.

    None for jobs without GPUs (``local-cpu`` trains tiny models). The CLI's ``render``, the job
    builder and the notebooks' job check all call this one function.
    """
    if not spec.profile_info.uses_gpus or not spec.gpus_per_node:
        return None
    return fit_warning(spec.recipe, spec.nodes, spec.gpus_per_node, gpu, spec.overrides)


@dataclass(frozen=True)
class Suggestion:
    nodes: int
    micro_batch: int
    tp: int
    checkpointing: str
    plan: Plan
    # render's own settings for this shape: ``{config key: value}`` of the recipe (``cookbook render --set``)
    sets: dict[str, str] = field(default_factory=dict)

    def render_args(self) -> str:
        """The ``cookbook render`` options of this shape, as render accepts them."""
        sets = "".join(f" --set {k}={v}" for k, v in self.sets.items())
        return f"--nodes {self.nodes} --gpus-per-node {self.plan.gpus_per_node}{sets}"

    def describe(self) -> str:
        p = self.plan
        return (
            f"{self.render_args()}: {p.peak_gib:.1f} GiB ({100 * p.margin_fraction:.0f}% free), "
            f"{p.tokens_per_s_per_gpu:,.0f} {p.unit}/s/GPU, step {p.step_time_s:.1f} s"
        )


def suggest(
    recipe: str,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    *,
    max_nodes: int = 32,
    min_margin: float = DEFAULT_MIN_MARGIN,
    limit: int = 5,
    **settings: Any,
) -> list[Suggestion]:
    """Job shapes that fit with ``min_margin`` free: fewest nodes first, then highest throughput.

    Tries nodes 1, 2, 4 ... ``max_nodes``; tensor parallel 1, 2, 4, 8 (within a node); checkpointing
    none/selective/full; micro-batch 1, 2, 4 ... 64 (FLUX up to 128): the values the recipe's config can
    be given (:meth:`cookbook.recipes.Recipe.planner_overrides`), each suggestion with its render ``--set``
    keys; a ``settings`` key of the recipe's config is kept in them as given.
    """
    from cookbook.recipes import get_recipe

    defaults: RecipeDefaults = recipe_defaults(recipe)
    target = get_recipe(recipe)
    gpn = gpus_per_node or defaults.gpus_per_node
    fixed = settings_overrides(settings)
    given = {k: str(v) for k, v in settings.items() if k in target.planner_keys and target.settable(k)}
    own_defaults = asdict(defaults.settings)
    found: list[Suggestion] = []
    powers = (1, 2, 4, 8, 16, 32, 64, 128)
    for nodes in (n for n in powers if n <= max_nodes):
        for tp in (1, 2, 4, 8):
            if tp > gpn or gpn % tp or (tp > 1 and get_model(defaults.model).kind == "flux"):
                continue
            for mode in CHECKPOINTING_MODES:
                if target.planner_overrides({"tp": tp, "checkpointing": mode}, own_defaults) is None:
                    continue  # the recipe's config cannot say it: render would refuse the suggestion
                for mb in powers:
                    kw = {**fixed, "tp": tp, "checkpointing": mode, "micro_batch": mb}
                    if defaults.settings.shard_group and defaults.settings.shard_group > nodes * gpn:
                        kw["shard_group"] = 0
                    p = plan(recipe, nodes, gpn, gpu, **kw)
                    if p.margin_fraction < min_margin:
                        break  # larger micro-batches only need more memory
                    shape = {"micro_batch": mb, "tp": tp, "checkpointing": mode}
                    own = target.planner_overrides(shape, own_defaults) or {}
                    found.append(Suggestion(nodes, mb, tp, mode, p, {**given, **own}))
        if found:
            break
    found.sort(
        key=lambda x: (
            x.nodes,
            -round(x.plan.tokens_per_s_per_gpu, 6),
            CHECKPOINTING_MODES.index(x.checkpointing),
            x.tp,
            -x.micro_batch,
        )
    )
    return found[:limit]
