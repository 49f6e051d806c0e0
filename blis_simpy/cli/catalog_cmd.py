"""``blis-simpy catalog``: the built-in GPUs, models and coefficient sets (offline).

::

    blis-simpy catalog [all|gpus|models|coefficients] [--model M] [--format table|json]
                       [--hardware-config FILE] [--defaults-filepath FILE]
    blis-simpy catalog capacity --model M --hardware G [--tp ...]   (or: catalog --capacity ...)

Tables are rich tables on stdout; ``--format json`` prints one JSON document with the same
content (``gpus``, ``models``, ``coefficients``). ``--hardware-config`` and
``--defaults-filepath`` show the catalogs as a run with those flags would see them.
``capacity`` prints the KV capacity pieces (:mod:`blis_simpy.cli.capacity_cmd`).
"""

from __future__ import annotations

import enum
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import typer

from blis_simpy.errors import ConfigError

if TYPE_CHECKING:   # the catalogs (YAML) load only when the command runs
    from blis_simpy.catalog.coefficients import CoefficientCatalog
    from blis_simpy.catalog.hardware import GPUCatalog
    from blis_simpy.catalog.models import ModelCatalog


class What(str, enum.Enum):
    all = "all"
    gpus = "gpus"
    models = "models"
    coefficients = "coefficients"
    capacity = "capacity"


class CatalogFormat(str, enum.Enum):
    table = "table"
    json = "json"


# ---------------------------------------------------------------------------- data
def interconnect_label(s) -> str:
    """``NVLink4 450 GB/s P2P`` / ``PCIe4 31.5 GB/s no P2P`` (bandwidth per GPU per direction)."""
    kind = {"nvlink": "NVLink", "pcie": "PCIe"}.get(s.interconnect, s.interconnect)
    return f"{kind}{s.interconnect_gen or ''} {s.link_bw_gbps:g} GB/s {'P2P' if s.p2p else 'no P2P'}"


def gpus_data(cat: GPUCatalog, fits: dict | None = None) -> dict:
    """Every GPU; with ``fits`` (:func:`model_fits`) only those that hold the model, each with
    ``min_tp`` and ``kv_tokens_per_gpu`` at that TP."""
    out = {}
    for name, e in cat.entries.items():
        if fits is not None and not _holds(fits.get(name)):
            continue
        d = asdict(e.spec)
        d.pop("name")
        out[name] = {"description": e.description, "aliases": list(e.aliases), **d,
                     "interconnect_label": interconnect_label(e.spec), "origin": e.origin}
        if fits is not None:
            out[name] |= {"min_tp": fits[name].tp, "kv_tokens_per_gpu": fits[name].tokens}
    return out


def model_fits(cat: GPUCatalog, models: ModelCatalog, model: str | None) -> dict | None:
    """``{GPU: KVCapacity at the smallest TP that holds model, None when no TP up to 64 does,
    or the reason (str) the model cannot be sized on it}`` (vLLM's capacity rule, default
    engine settings); None without a ``model`` in the catalog."""
    from blis_simpy.kv.capacity import KVCapacityError
    from blis_simpy.kv.vllm_capacity import smallest_fitting
    entry = models.find(model) if model else None
    if entry is None:
        return None
    out: dict = {}
    for name, e in cat.entries.items():
        try:
            out[name] = smallest_fitting(entry.config, e.spec)
        except KVCapacityError as exc:
            out[name] = str(exc)
    return out


def _holds(fit) -> bool:
    return fit is not None and not isinstance(fit, str)


def models_data(cat: ModelCatalog, coeffs: CoefficientCatalog, model: str | None = None) -> dict:
    from blis_simpy.catalog.hfconfig import derive_max_model_len
    out = {}
    for name, e in cat.entries.items():
        if model is not None and name != model:
            continue
        c = asdict(e.config)
        c.pop("name")
        c.pop("moe_count_missing")
        d = coeffs.deployment_defaults(name)
        out[name] = {"hf_repo": e.hf_repo, **c, "real_head_dim": e.config.real_head_dim,
                     "num_moe_layers": e.config.num_moe_layers,
                     "derived_max_model_len": derive_max_model_len(e.config),
                     "defaults": asdict(d) if d else None}
    return out


def coefficients_data(cat: CoefficientCatalog, model: str | None = None) -> dict:
    rows = [asdict(r) for m, rs in cat.blackbox.items() for r in rs if model is None or m == model]
    gsets = {k: asdict(v) if v else None for k, v in
             (("crossmodel", cat.crossmodel), ("trained_roofline", cat.trained_roofline))}
    defaults = {m: asdict(d) for m, d in cat.defaults.items() if model is None or m == model}
    return {"defaults": defaults, "blackbox": rows, **gsets}


def coefficient_coverage(cat: CoefficientCatalog) -> list[str]:
    """``model: GPU, GPU`` for every model with blackbox coefficient rows (catalog order)."""
    out = []
    for m, rs in cat.blackbox.items():
        gpus = sorted({r.gpu for r in rs})
        if gpus:
            out.append(f"{m}: {', '.join(gpus)}")
    return out


# ---------------------------------------------------------------------------- tables
def _num(v: float) -> str:
    return f"{v:g}" if v else "-"


def _coeffs(vs) -> str:
    return ", ".join(f"{v:.6g}" for v in vs)


def print_tables(what: What, gpus: GPUCatalog, models: ModelCatalog, coeffs: CoefficientCatalog,
                 model: str | None) -> None:
    from rich.table import Table

    from blis_simpy.cli.tables import Fitted, stdout_console
    con = stdout_console()
    json_note = "--format json has them"
    if what in (What.all, What.gpus):
        fits = model_fits(gpus, models, model)
        shown = {n: e for n, e in gpus.entries.items() if fits is None or _holds(fits[n])}
        if fits is None:
            title = f"GPUs ({len(shown)}) — dense figures; --hardware KEY"
        else:
            title = (f"GPUs that hold {model} ({len(shown)} of {len(gpus.entries)}; smallest TP by "
                     "vLLM's KV-capacity rule, default settings) — --hardware KEY")
        t = Table(title=title)
        cols = ["key", "description", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "memory GiB",
                "driver GiB", "MFU prefill", "MFU decode", "interconnect (per direction)", "collective µs"]
        if fits is not None:
            cols += ["min TP", "KV tokens/GPU"]
        for col in cols:
            t.add_column(col, overflow="fold", no_wrap=col == "key")
        for name, e in shown.items():
            s = e.spec
            row = [name, e.description, _num(s.tflops_peak), _num(s.tflops_fp8), _num(s.bw_peak_tbs),
                   _num(s.memory_gib), f"{s.memory_torch_gib:.2f}" if s.memory_torch_gib else "-",
                   _num(s.mfu_prefill), _num(s.mfu_decode), interconnect_label(s),
                   _num(s.collective_latency_us)]
            if fits is not None:
                row += [str(fits[name].tp), f"{fits[name].tokens:,}"]
            t.add_row(*row)
        con.print(Fitted(t, drop=("collective µs", "MFU decode", "MFU prefill", "FP8 TFLOP/s", "driver GiB",
                                  "description"), note=json_note))
        if fits is not None:
            small = [n for n in gpus.entries if fits[n] is None]
            if small:
                con.print(f"Too small for {model} at any TP up to 64: {', '.join(small)}", highlight=False)
            for n in gpus.entries:
                if isinstance(fits[n], str):
                    con.print(f"Cannot size {model} on {n}: {fits[n]}", highlight=False)
        con.print("Sources:")
        for name, e in shown.items():
            con.print(f"  {name}: {e.spec.source}", highlight=False)
    if what in (What.all, What.models):
        from blis_simpy.catalog.hfconfig import derive_max_model_len
        shown = {n: e for n, e in models.entries.items() if model is None or n == model}
        if model is not None and not shown:
            con.print(f"{model} is not in the model catalog ({len(models.entries)} models: "
                      "`blis-simpy catalog models`); --model-config-folder reads any HuggingFace "
                      "config.json", highlight=False)
        t = Table(title=f"Models ({len(shown)}{'' if model is None else f' of {len(models.entries)}'})"
                        " — --model ID (offline shapes)")
        for col in ("model", "layers", "hidden", "heads/kv", "head dim", "FFN", "experts", "dtype / weights",
                    "max len", "default GPU/TP/vLLM"):
            t.add_column(col, overflow="fold", no_wrap=col == "model")
        for name, e in shown.items():
            c = e.config
            experts = (f"{c.num_local_experts} top-{c.num_experts_per_tok}" if c.is_moe else "-")
            if c.is_moe and c.num_moe_layers != c.num_layers:
                experts += f", {c.num_moe_layers} MoE layers"
            head = f"{c.real_head_dim}" + ("" if c.head_dim else " (d/H)")
            if c.kv_lora_rank:
                head += f", MLA {c.kv_lora_rank}+{c.qk_rope_head_dim}"
            ffn = f"{c.intermediate_size}" + (f" / {c.moe_intermediate_size}" if c.moe_intermediate_size else "")
            if c.is_moe and c.dense_intermediate_size and c.num_moe_layers != c.num_layers:
                ffn += f", dense {c.dense_intermediate_size}"
            w = f"{c.bytes_per_param:g} B" + (f" / {c.weight_bytes_per_param:g} B" if c.weight_bytes_per_param else "")
            d = coeffs.deployment_defaults(name)
            t.add_row(name, str(c.num_layers), str(c.hidden_size), f"{c.num_heads}/{c.num_kv_heads}", head, ffn,
                      experts, w, str(derive_max_model_len(c)), f"{d.gpu} / {d.tp} / {d.vllm}" if d else "-")
        if shown:
            con.print(Fitted(t, drop=("default GPU/TP/vLLM", "max len", "dtype / weights", "FFN", "head dim"),
                             note=json_note))
    if what in (What.all, What.coefficients):
        rows = [r for m, rs in coeffs.blackbox.items() for r in rs if model is None or m == model]
        t = Table(title=f"Blackbox coefficients ({len(rows)} rows; first match of model, GPU, TP, vLLM wins)")
        for col in ("model", "GPU", "TP", "vLLM", "KV blocks", "alpha (µs)", "beta (µs)"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r.model, r.gpu, str(r.tp), r.vllm, str(r.kv_blocks), _coeffs(r.alpha), _coeffs(r.beta))
        if rows or model is None:
            con.print(Fitted(t, drop=("KV blocks", "vLLM"), note=json_note))
        else:           # say where coefficients are, rather than an empty table
            con.print(f"No blackbox coefficients for {model}. Models and GPUs that have them:",
                      highlight=False)
            for line in coefficient_coverage(coeffs):
                con.print(f"  {line}", highlight=False)
            con.print("Without them: --latency-model physics (the default), roofline or "
                      "trained-physics need only the model's shape and the GPU.", highlight=False)
        t = Table(title="Global coefficient sets (crossmodel, trained-roofline)")
        for col in ("backend", "alpha", "beta"):
            t.add_column(col, overflow="fold")
        for name, gs in (("crossmodel", coeffs.crossmodel), ("trained-roofline", coeffs.trained_roofline)):
            if gs is not None:
                t.add_row(name, _coeffs(gs.alpha), _coeffs(gs.beta))
        con.print(t)


# ---------------------------------------------------------------------------- command
#: options that only ``catalog capacity`` reads (parameter name → its flag)
CAPACITY_ONLY = {"hardware": "--hardware", "tp": "--tp", "dp": "--dp",
                 "expert_parallel": "--enable-expert-parallel", "util": "--gpu-memory-utilization",
                 "tokens": "--max-num-batched-tokens", "seqs": "--max-num-seqs",
                 "block_size": "--block-size-in-tokens", "capacity_model": "--kv-capacity-model",
                 "kv_cache_dtype": "--kv-cache-dtype", "model_config_folder": "--model-config-folder"}


def _refuse_capacity_only(ctx) -> None:
    """A capacity option given to the listing (``catalog --tp -1``) would be ignored without
    a word; it is refused instead, naming the flag."""
    for name, flag in CAPACITY_ONLY.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT":
            raise ConfigError("is read only by `catalog capacity` (or --capacity)", field=flag)


def register(app: typer.Typer) -> None:
    @app.command("catalog")
    def catalog(
        ctx: typer.Context,
        what: What = typer.Argument(What.all, help="which catalog to list"),
        fmt: CatalogFormat = typer.Option(CatalogFormat.table, "--format", case_sensitive=False,
                                          help="rich tables or one JSON document"),
        model: str = typer.Option(None, "--model", help="only this model: its shape, coefficient rows, "
                                  "defaults, and the GPUs that hold it (smallest TP)"),
        hardware_config: str = typer.Option("", "--hardware-config", metavar="FILE",
                                            help="BLIS hardware_config.json to add"),
        defaults_filepath: str = typer.Option("", "--defaults-filepath", metavar="FILE",
                                              help="BLIS defaults.yaml layered over the coefficients"),
        # the KV capacity of --model on --hardware (``catalog capacity`` / ``catalog --capacity``)
        capacity: bool = typer.Option(False, "--capacity", help="show the KV capacity of --model on "
                                      "--hardware piece by piece (same as `catalog capacity`)"),
        hardware: str = typer.Option(None, "--hardware", help="capacity: GPU key"),
        tp: int = typer.Option(1, "--tp", help="capacity: tensor parallelism"),
        dp: int = typer.Option(1, "--dp", help="capacity: data-parallel ranks"),
        expert_parallel: bool = typer.Option(False, "--enable-expert-parallel",
                                             help="capacity: shard MoE experts over TP x DP"),
        util: float = typer.Option(0.9, "--gpu-memory-utilization", help="capacity: GPU memory fraction"),
        tokens: int = typer.Option(2048, "--max-num-batched-tokens", "--max-num-scheduled-tokens",
                                   help="capacity: tokens of the profile run (per DP rank)"),
        seqs: int = typer.Option(256, "--max-num-seqs", "--max-num-running-reqs",
                                 help="capacity: requests of the profile run (per DP rank)"),
        block_size: int = typer.Option(16, "--block-size-in-tokens", help="capacity: tokens per KV block"),
        capacity_model: str = typer.Option("vllm", "--kv-capacity-model", help="capacity: vllm | blis"),
        kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="capacity: KV element type"),
        model_config_folder: str = typer.Option("", "--model-config-folder", metavar="DIR",
                                                help="capacity: folder with the model's config.json"),
    ) -> None:
        """List the offline catalogs: GPUs, model shapes, trained coefficient sets; or the KV
        capacity of a model on a GPU (`catalog capacity --model M --hardware G`)."""
        from blis_simpy.catalog.coefficients import builtin_coefficients, read_blis_defaults
        from blis_simpy.catalog.hardware import gpu_catalog
        from blis_simpy.catalog.models import builtin_models
        gpus = gpu_catalog(hardware_config)
        if capacity or what is What.capacity:
            from blis_simpy.cli import capacity_cmd
            cap = capacity_cmd.compute(
                gpus, model, hardware, tp=tp, dp=dp, expert_parallel=expert_parallel, util=util,
                max_num_batched_tokens=tokens, max_num_seqs=seqs, block_size=block_size,
                capacity_model=capacity_model, kv_cache_dtype=kv_cache_dtype,
                model_config_folder=model_config_folder)
            capacity_cmd.show(cap, model.lower(), fmt.value)
            return
        _refuse_capacity_only(ctx)
        models = builtin_models()
        coeffs = builtin_coefficients()
        if defaults_filepath:
            coeffs = read_blis_defaults(defaults_filepath, field="--defaults-filepath").layered_over(coeffs)
        model = model.lower() if model else None
        if fmt is CatalogFormat.json:
            doc = {}
            if what in (What.all, What.gpus):
                doc["gpus"] = gpus_data(gpus, model_fits(gpus, models, model))
            if what in (What.all, What.models):
                doc["models"] = models_data(models, coeffs, model)
            if what in (What.all, What.coefficients):
                doc["coefficients"] = coefficients_data(coeffs, model)
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            print_tables(what, gpus, models, coeffs, model)
