"""``blis-simpy convert KIND``: other workload and log formats into ours (docs/workloads.md).

::

    blis-simpy convert preset --name N [--rate 1.0] [--num-requests 100] [--defaults-filepath F] [--output FILE]
    blis-simpy convert servegen --path DIR [--output FILE]
    blis-simpy convert inference-perf --spec FILE [--output FILE]
    blis-simpy convert vllm-log --run DIR [--workload FILE] --output PREFIX
    blis-simpy convert vllm-bench --result FILE.json --output PREFIX

BLIS's three kinds print a workload-spec v2 YAML (or write it to ``--output``). ``vllm-log``
writes ``PREFIX.header.yaml`` + ``PREFIX.csv`` (TraceV2, mode real, real prompt token IDs),
``PREFIX.scenario.yaml`` and ``PREFIX.timeseries.csv``; ``vllm-bench`` writes the TraceV2
pair. Both print one summary line; assumptions go to stderr as ``warning:`` lines. Every file
is written only after all input parsed, all-or-nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:   # the observed stack (numpy) loads only when a conversion runs
    from blis_simpy.measured.run import MeasuredRun

convert_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Convert presets, ServeGen, inference-perf, vLLM logs and vllm bench "
                               "results into workload specs or TraceV2 traces.")

@convert_app.callback()
def _convert() -> None:
    # the converters' warnings (a skipped ServeGen row or chunk) in the CLI's log format,
    # not Python's bare last-resort line
    from blis_simpy.cli.logs import setup_logging
    setup_logging(None)


_OUTPUT_SPEC = typer.Option(None, "--output", metavar="FILE", help="write the YAML here instead of printing it")


def _emit_spec(spec, output: Path | None) -> None:
    from blis_simpy.measured.converted import write_files
    from blis_simpy.workload.convert import spec_to_yaml
    text = spec_to_yaml(spec)
    if output is None:
        sys.stdout.write(text)
    else:
        write_files({output: text})
        print(f"wrote {output}")


def _check_prefix(output: Path) -> None:
    from blis_simpy.measured.converted import paths
    paths(output, field="--output")


def _emit_run(run: MeasuredRun, output: Path) -> None:
    from blis_simpy.measured.converted import converted_files, write_files
    written = write_files(converted_files(run, output))
    for note in run.notes:
        print(f"warning: {note}", file=sys.stderr)
    recs = run.records
    span_s = max((r.arrival_time_us for r in recs), default=0) / 1e6
    last_s = max((r.last_chunk_time_us for r in recs), default=0) / 1e6
    failed = sum(1 for r in recs if r.status != "ok")
    print(f"converted {run.name}: {len(recs)} rows" + (f" ({failed} failed)" if failed else "")
          + f", arrivals over {span_s:.3f} s, last token at {last_s:.3f} s; wrote "
          + ", ".join(str(p) for p in written))


@convert_app.command("preset")
def preset_cmd(
    name: str = typer.Option(..., "--name", help="chatbot | contentgen | summarization | multidoc "
                             "(or a preset of --defaults-filepath)"),
    rate: float = typer.Option(1.0, "--rate", help="requests per second"),
    num_requests: int = typer.Option(100, "--num-requests", help="requests to generate"),
    defaults_filepath: str = typer.Option("", "--defaults-filepath", metavar="FILE",
                                          help="BLIS defaults.yaml whose workloads: section holds the presets"),
    output: Path | None = _OUTPUT_SPEC,
) -> None:
    """Print a preset as a workload-spec v2 (client preset-<name>, constant arrivals,
    Gaussian lengths)."""
    from blis_simpy.workload.convert import preset_workload
    _emit_spec(preset_workload(name, rate, num_requests, defaults_filepath), output)


@convert_app.command("servegen")
def servegen_cmd(
    path: str = typer.Option(..., "--path", metavar="DIR", help="folder of chunk-<id>-trace.csv and "
                             "chunk-<id>-dataset.json"),
    output: Path | None = _OUTPUT_SPEC,
) -> None:
    """Print the workload-spec v2 built from ServeGen chunks (one client per usable chunk)."""
    from blis_simpy.workload.convert import servegen_workload
    _emit_spec(servegen_workload(path), output)


@convert_app.command("inference-perf")
def inference_perf_cmd(
    spec: str = typer.Option(..., "--spec", metavar="FILE", help="inference-perf stages + shared_prefix "
                             "(or a v2 spec with an inference_perf section)"),
    output: Path | None = _OUTPUT_SPEC,
) -> None:
    """Print the expanded workload-spec v2 of an inference-perf definition."""
    from blis_simpy.workload.convert import inference_perf_workload
    _emit_spec(inference_perf_workload(spec), output)


@convert_app.command("vllm-log")
def vllm_log_cmd(
    run: Path = typer.Option(..., "--run", metavar="DIR", help="run folder: requests.jsonl, meta.json "
                             "[, timeseries.csv]; or an LLMServingSim example folder <hw>/<model>/ "
                             "holding vllm/"),
    workload: Path | None = typer.Option(None, "--workload", metavar="FILE",
                                         help="the workload JSONL (default: meta.json dataset_path, "
                                              "looked for in DIR and its parent, then under DIR's "
                                              "ancestors)"),
    output: Path = typer.Option(..., "--output", metavar="PREFIX",
                                help="writes PREFIX.header.yaml, .csv, .scenario.yaml, .timeseries.csv"),
) -> None:
    """Convert a real vLLM request log into TraceV2 (with the real prompt token IDs), a
    scenario with the run's settings, and its timeseries."""
    from blis_simpy.measured.vllm_log import load_vllm_log
    _check_prefix(output)
    _emit_run(load_vllm_log(run, workload), output)


@convert_app.command("vllm-bench")
def vllm_bench_cmd(
    result: Path = typer.Option(..., "--result", metavar="FILE.json",
                                help="vllm bench serve --save-result --save-detailed output"),
    output: Path = typer.Option(..., "--output", metavar="PREFIX",
                                help="writes PREFIX.header.yaml and PREFIX.csv"),
) -> None:
    """Convert a `vllm bench serve` result file into TraceV2 (mode real, no token IDs)."""
    from blis_simpy.measured.vllm_bench import load_vllm_bench
    _check_prefix(output)
    _emit_run(load_vllm_bench(result), output)


def register(app: typer.Typer) -> None:
    app.add_typer(convert_app, name="convert")
