"""Profile the real engine: the makespans of whole batches over a grid of batch sizes, prompt lengths and
length spreads, plus per-iteration decode times and the time to first token, all measured through the very
`VLLMEngine` path a run uses, so the client-side work per token (streaming, the controller's queue) is in
the figures.

    engine = start_engine(setup, prompts)
    decode, prefill, batches = measure(engine, batch_sizes=(1, 8, 32), prompt_lens=(8, 128), length=128)
    model = fit(decode, prefill, batches)        # lssim.cost.ProfiledCostModel

How: a cell (n, P, spread) submits n requests at once, each with a random prompt of P tokens and an exact
number of tokens to generate (`ignore_eos`): all `length` ("lockstep": the batch stays n throughout) or
drawn from a long tail capped at `length` ("longtail": the batch shrinks as they finish, as in a rollout).
Its makespan (submission to the last token) is one row of `batches`. In lockstep cells a progress
checkpoint every `window` tokens timestamps each request; the time between two checkpoints over `window`
is one iteration's time at n running sequences and total context n*(P + tokens so far) (`decode`).

Why makespans: per-iteration times measured in lockstep miss what a rollout pays when its batch shrinks
(each sequence leaving the batch costs the CPU engine 0.3-0.5 ms of re-packing), and a fit to iterations
alone predicted the CPU engine's steps 7-10% short. A batch's makespan
is linear in all of the model's coefficients (lssim.cost.batch_features), so `fit` fits them to the
quantity the simulator predicts, and reports the per-iteration error beside.

Aborts (`measure_aborts`): a rollout that ends with requests still running aborts them, and the caller is blocked for
each (one round trip to vLLM's loop: 0.14-0.19 ms a request on this VM, `real_backend/data/profile_cpu.json` and
`validation/full7/profile.json`). `profile_engine` measures it after the cells and stores the slope through the
origin as the model's `abort_seconds` (a1), which the simulator charges to its clock per abort.

Resumes (real_backend.resume_probe): a response aborted in flight and resubmitted with its tokens (an async weight
arrival, a carry, a requeue) costs more than its abort and its re-prefill; `profile_engine` measures it after the
aborts and stores the unpriced part per request as `resume_seconds` (r1), which the simulator charges to its clock
when it resubmits such responses.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .cells import longtail_lengths, random_requests
from .layout import layout_path, profile_layout
from .resume_probe import fit_resume_seconds, measure_resumes
from .speed_probe import probed_measurement, write_reference

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96)
DEFAULT_PROMPT_LENS = (8, 64, 256)  # the task's prompts are 7 tokens; a resumed response's prefix is longer


SPREADS = ("lockstep", "longtail")


CUTS = (0.25, 0.5, 0.75)  # where a long-tailed batch is also cut: the finish-time curve, not only its end


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _batch_rows(n, p, spread, lengths, finish_times, rep, driver=None) -> list[dict]:
    """A batch's makespan, and for a long-tailed batch also the time its requests at the CUTS quantiles of
    length finished: the makespan of the same batch cut at that length (every longer request counted as
    ending there), which is what a rollout that stops early (april) costs. These rows tell a large batch's
    iterations from a small one's within one cell, where the whole makespan only gives their sum.
    `driver(seconds)`: the driver's own seconds in the cell's first `seconds` (a row's driver_seconds: the submit
    call and the handling of the streams on the caller's thread, as a run's steps.parquet records it; NaN without)."""
    def row(cut, lens, seconds):
        return {"n_seqs": n, "prompt_len": p, "spread": spread, "cut": cut, "lengths": lens, "seconds": seconds,
                "repeat": rep, "driver_seconds": _or_nan(driver(seconds) if driver is not None else None)}

    rows = [row(1.0, list(lengths), max(finish_times))]
    if spread == "lockstep" or n < 4:
        return rows
    order, seen = sorted(lengths), set()
    for q in CUTS:
        cut = order[int(q * n)]
        if cut < order[-1] and cut not in seen:
            seen.add(cut)
            seconds = max(t for l, t in zip(lengths, finish_times) if l == cut)
            rows.append(row(q, [min(l, cut) for l in lengths], seconds))
    return rows


def measure(engine, batch_sizes=DEFAULT_BATCH_SIZES, prompt_lens=DEFAULT_PROMPT_LENS, length: int = 256,
            window: int = 16, repeats: int = 2, seed: int = 0, progress=None,
            instance: int | None = None, between_cells=None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Measure `engine` (a VLLMEngine with nothing in flight); on an engine of several instances, pass `instance`
    (every request runs there, the others idle: one instance's own speed). Returns (decode, prefill, batches) frames:
    decode rows n_seqs, ctx_tokens, seconds (one iteration, averaged over a window and the batch), with the
    cell's prompt_len and repeat; prefill rows n_seqs, prompt_len, prefill_tokens, ttft_seconds; batches rows
    n_seqs, prompt_len, spread, cut, lengths, seconds (submission to the last token of the batch cut at the
    `cut` quantile of its lengths: 1.0 is the whole batch), repeat, driver_seconds (the caller's own part of those
    seconds, VLLMEngine.driver_seconds; not used by the fit yet: what a cell's driver holds, beside a run's). `between_cells(i)` is called after cell i, with
    nothing in flight (real_backend.speed_probe times the machine's speed there)."""
    if length < 2 * window:
        raise ValueError(f"length ({length}) must be at least two windows ({2 * window} tokens)")
    rng = np.random.default_rng(seed)
    prompts: dict[int, list[int]] = {}
    rows = {"decode": [], "prefill": [], "batches": []}
    cells = [(rep, p, n, spread) for rep in range(repeats) for p in prompt_lens for n in batch_sizes for spread in SPREADS]
    # In a random order: the machine's speed drifts over minutes, and drift must not pass for a trend in n or P.
    cells = [cells[i] for i in rng.permutation(len(cells))]
    engine.set_progress_interval(window)
    try:
        with engine.serving_exactly(prompts):  # exactly max_tokens tokens each
            rid = 0
            for cell, (rep, p, n, spread) in enumerate(progress(cells) if progress else cells):
                if cell and between_cells is not None:
                    between_cells(cell - 1)
                _time_cell_rows(engine, prompts, rng, rid, (rep, p, n, spread), length, instance, rows)
                rid += n
    finally:
        engine.set_progress_interval(None)
    return pd.DataFrame(rows["decode"]), pd.DataFrame(rows["prefill"]), pd.DataFrame(rows["batches"])


def _time_cell_rows(engine, prompts: dict, rng, rid: int, cell: tuple, length: int, instance, rows: dict) -> None:
    """One profile cell timed on the engine: its rows appended to `rows` (decode, prefill, batches)."""
    rep, p, n, spread = cell
    lengths = [length] * n if spread == "lockstep" else longtail_lengths(rng, n, length)
    cell_prompts, requests = random_requests(rng, engine.vocab_size, lengths, rid, p, instance)
    prompts.update(cell_prompts)
    stamps = {r.rid: {} for r in requests}
    t_submit = engine.now()
    engine.submit(requests)
    left, finish = n, {}
    while left:
        for ev in engine.next_events():
            stamps[ev.request.rid][ev.request.generated] = ev.time
            if ev.kind == "finished":
                left, finish[ev.request.rid] = left - 1, ev.time - t_submit
    rows["batches"] += _batch_rows(n, p, spread, lengths, [finish[r.rid] for r in requests], rep,
                                   lambda sec: engine.driver_seconds(t_submit, t_submit + sec))
    for r in requests:
        prompts.pop(r.rid, None)
    if spread != "lockstep":
        return
    ttft = float(np.mean([r.first_token_time for r in requests])) - t_submit
    rows["prefill"].append({"n_seqs": n, "prompt_len": p, "prefill_tokens": n * p, "ttft_seconds": ttft, "repeat": rep})
    # Iteration time per window, averaged over the batch (they run in lockstep).
    marks = sorted(set.intersection(*(set(s) for s in stamps.values())))
    for a, b in zip(marks, marks[1:]):
        dt = float(np.mean([stamps[r.rid][b] - stamps[r.rid][a] for r in requests])) / (b - a)
        rows["decode"].append({"n_seqs": n, "ctx_tokens": n * (p + (a + b) / 2), "seconds": dt,
                               "prompt_len": p, "generated": (a + b) / 2, "repeat": rep})


ABORT_SIZES = (8, 32, 64)  # running requests aborted at once: a rollout's end carries or drops tens of them


def measure_aborts(engine, sizes=ABORT_SIZES, rounds: int = 2, prompt_len: int = 8, length: int = 256, seed: int = 1,
                   instance: int | None = None) -> pd.DataFrame:
    """How long aborting running requests blocks the caller (the client side of vLLM's abort: one round trip each,
    which a rollout that ends with requests still running pays before its step can end). Cells of n requests (n from
    `sizes`, `rounds` times each) submitted at once and run until every one has generated tokens, then aborted one by
    one as the controller does (VLLMEngine.abort). Rows: n, seconds (the aborts' wall time)."""

    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    prompts: dict[int, list[int]] = {}
    rows, rid = [], 10**9  # rids apart from the profile's cells
    with engine.serving_exactly(prompts):
        engine.set_progress_interval(4)
        try:
            for n in [n for _ in range(rounds) for n in sizes]:
                cell_prompts, requests = random_requests(rng, vocab, [length] * n, rid, prompt_len, instance)
                prompts.update(cell_prompts)  # (the dict the engine serves from)
                rid += n
                engine.submit(requests)
                started: set[int] = set()
                while len(started) < n:  # every one running: it has passed its first progress checkpoint
                    started.update(ev.request.rid for ev in engine.next_events())
                t0 = time.monotonic()
                for r in requests:
                    engine.abort(r)
                rows.append({"n": n, "seconds": time.monotonic() - t0})
        finally:
            engine.set_progress_interval(None)
    return pd.DataFrame(rows)


def fit_abort_seconds(aborts: pd.DataFrame) -> float:
    """Seconds per request aborted: the least-squares slope through the origin of the aborts' wall time on n."""
    n, t = aborts["n"].to_numpy(float), aborts["seconds"].to_numpy(float)
    return float(max(0.0, (n * t).sum() / (n * n).sum())) if len(n) else 0.0


def fit(decode: pd.DataFrame, prefill: pd.DataFrame | None = None, batches: pd.DataFrame | None = None, name: str = "profiled"):
    """The ProfiledCostModel of these measurements. With `batches`: every coefficient fitted to the batch
    makespans (ProfiledCostModel.fit_makespans), fit_stats the makespan error plus the per-iteration error on
    `decode` under "iteration". Without: decode fitted to the windowed iterations, prefill to the time to first
    token less the first iteration (what the simulator adds back when it admits), no departure cost."""
    from lssim.cost import ProfiledCostModel

    quadratic = decode["n_seqs"].nunique() >= 3  # a batch-size curvature needs three batch sizes to show
    if batches is not None and len(batches):
        model = ProfiledCostModel.fit_makespans(batches, quadratic_n=quadratic, name=name)
        model.fit_stats = {**model.fit_stats, "iteration": model.fit_error(decode)}
        return model
    base = ProfiledCostModel.fit(decode, quadratic_n=quadratic, name=name)
    if prefill is None:
        return base
    first_iter = np.array([base.decode_time(int(n), float(n * p), 1)
                           for n, p in zip(prefill["n_seqs"], prefill["prompt_len"])])
    pre = pd.DataFrame({"prefill_tokens": prefill["prefill_tokens"],
                        "seconds": np.maximum(prefill["ttft_seconds"].to_numpy(float) - first_iter, 1e-6)})
    return ProfiledCostModel.fit(decode, pre, quadratic_n=quadratic, name=name)


def run(args) -> int:
    """`lssim profile`: start the engine, measure, fit, write the profile JSON and the measurements."""
    if args.trainer:  # the trainer stage: its own profiler, the same output conventions
        from .profile_trainer import main as profile_trainer

        return profile_trainer(["--out", args.out, "--model-dir", args.model_dir, "--repeats", str(args.repeats)])
    import os
    import sys
    from pathlib import Path

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.loop.controller import RunConfig
    from lssim.results import atomic_write

    from .world import RealSetup, prepare, start_engine

    out = Path(args.out)
    if out.suffix != ".json":
        raise ValueError(f"--out {args.out}: the profile is a .json file")
    if not out.parent.exists():
        raise ValueError(f"--out {args.out}: folder {out.parent} does not exist")
    if args.shared_host:  # the engine beside the GRPO trainer on this host (real_backend.host_sharing)
        from .host_sharing import run_sharing

        return run_sharing(args, out)
    if args.instances > 1 or args.speculating:
        return _run_layout(args, out)
    if args.cpus is not None:
        raise ValueError("--cpus binds the instances of a layout: give it with --instances N (N >= 2) or --speculating")
    batch_sizes, prompt_lens = int_list(args.batch_sizes, "--batch-sizes"), int_list(args.prompt_lens, "--prompt-lens")
    setup = RealSetup(model_dir=args.model_dir, max_model_len=args.max_model_len, max_num_seqs=max(batch_sizes),
                      kv_cache_gib=args.kv_cache_gib)
    if max(prompt_lens) + args.length > setup.max_model_len:
        raise ValueError(f"longest prompt ({max(prompt_lens)}) + --length ({args.length}) exceeds --max-model-len {setup.max_model_len}")
    prompts, _ = prepare(setup, "baseline", RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=args.length))
    print(f"lssim profile: {len(batch_sizes)} batch sizes x {len(prompt_lens)} prompt lengths x {args.repeats} repeats, "
          f"{args.length} tokens each; model {setup.model_dir}", file=sys.stderr)
    t0 = time.monotonic()
    engine = start_engine(setup, prompts, seed=0)
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    models = []
    try:  # with speed probes around it: runs validated against this profile can be scaled to their own level
        probes = probed_measurement(engine, lambda **kw: models.append(profile_engine(
            engine, out, batch_sizes=batch_sizes, prompt_lens=prompt_lens, length=args.length, window=args.window,
            repeats=args.repeats, meta={"command": " ".join(["lssim", "profile", *sys.argv[2:]]),
                                        "model": _relative(setup.model_dir)}, **kw)), every=12)
        write_reference(out, probes)
    finally:
        engine.close()
    model = models[0]
    err, it = model.fit_stats, model.fit_stats["iteration"]
    print(f"{model!r}\nfit error per batch makespan: median {err['median_ape_pct']:.1f}%, p90 {err['p90_ape_pct']:.1f}%, "
          f"max {err['max_ape_pct']:.1f}% over {err['n_points']} batches; per iteration (lockstep windows): median "
          f"{it['median_ape_pct']:.1f}%, p90 {it['p90_ape_pct']:.1f}% over {it['n_points']} windows\n"
          f"written to {out} (+ {out.stem}_decode.parquet, _prefill.parquet, _batches.parquet)")
    return 0


def _run_layout(args, out) -> int:
    """`lssim profile --out PROFILE --instances N [--cpus C] [--speculating]`: an engine of N instances (started with
    the n-gram speculation spec_tail asks for, drafting off, with --speculating) measured against the existing
    one-instance PROFILE (real_backend.layout), written beside it as <stem>_layout<N>[_speculating].json."""
    import sys

    from lssim.loop.controller import RunConfig

    from .world import RealSetup, prepare, start_engine

    if not out.is_file():
        raise ValueError(f"--out {out}: with --instances, --out names the one-instance profile the layout is measured "
                         f"against (`lssim profile --out {out}` first)")
    from lssim.cost import ProfiledCostModel

    ProfiledCostModel.from_json(out)
    setup = RealSetup(model_dir=args.model_dir, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
                      n_instances=args.instances, cpus=args.cpus)
    if args.speculating:
        setup.temperature = 0.0  # what prepare asks of a speculating engine on the CPU build (greedy only)
    prompts, _ = prepare(setup, "spec_tail" if args.speculating else "baseline",
                         RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=args.length))
    engine = start_engine(setup, prompts, seed=0)
    try:
        probes = probed_measurement(engine, lambda **kw: profile_layout(
            engine, out, args.cpus, length=args.length, repeats=args.repeats,
            meta={"command": " ".join(["lssim", "profile", *sys.argv[2:]]), "model": _relative(setup.model_dir),
                  "machine": _machine()}, **kw), every=4)
        write_reference(layout_path(out, args.instances, args.speculating), probes, engine.n_instances)
    finally:
        engine.close()
    return 0


def measurement_files(profile) -> dict:
    """Where a profile's measurements lie beside it: <stem>_decode/_prefill/_batches.parquet."""
    from pathlib import Path

    stem = Path(profile).with_suffix("")
    return {kind: Path(f"{stem}_{kind}.parquet") for kind in ("decode", "prefill", "batches")}


def profile_engine(engine, out, *, batch_sizes=DEFAULT_BATCH_SIZES, prompt_lens=DEFAULT_PROMPT_LENS, length: int = 256,
                   window: int = 16, repeats: int = 2, meta: dict | None = None, instance: int | None = None,
                   between_cells=None):
    """Measure a running engine (on an engine of several instances: on `instance`, the others idle), fit the model,
    write it to `out` (JSON) with the measurements beside it as <stem>_decode/_prefill/_batches.parquet (each
    atomically). Returns the ProfiledCostModel."""
    import sys
    from pathlib import Path

    from lssim.results import atomic_write
    from tqdm import tqdm

    out = Path(out)
    decode, prefill, batches = measure(engine, batch_sizes, prompt_lens, length, window, repeats, instance=instance,
                                       progress=lambda cells: tqdm(cells, desc="profile cells", unit="cell", file=sys.stderr),
                                       between_cells=between_cells)
    model = fit(decode, prefill, batches, name=f"vllm {Path(engine.model).name}")
    aborts = measure_aborts(engine, length=length, instance=instance)
    model.abort_seconds = fit_abort_seconds(aborts)
    resumes = measure_resumes(engine, model, instance=instance)  # after a1: the resume's unpriced part is beyond it
    model.resume_seconds = fit_resume_seconds(resumes)
    for kind, frame in (("decode", decode), ("prefill", prefill), ("batches", batches)):
        atomic_write(measurement_files(out)[kind], lambda p, f=frame: f.to_parquet(p, index=False))
    meta = {"engine": "vllm (VLLMEngine)", "machine": _machine(), "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "grid": {"batch_sizes": list(batch_sizes), "prompt_lens": list(prompt_lens), "length": length,
                     "window": window, "repeats": repeats},
            **({"instance": f"{instance} of {engine.n_instances} (the others idle)"} if instance is not None else {}),
            "aborts": {"n": aborts["n"].tolist(), "seconds": [round(v, 6) for v in aborts["seconds"]]},
            "resumes": {k: [round(v, 6) if isinstance(v, float) else v for v in resumes[k].tolist()]
                        for k in ("n", "resume", "seconds", "priced_seconds")},
            **(meta or {})}
    atomic_write(out, lambda p: model.to_json(p, meta=meta))
    return model


def add_arguments(p) -> None:
    from . import task

    p.add_argument("--out", required=True, metavar="JSON", help="profile to write (measurements go beside it as parquet)")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)), metavar="N,N,...",
                   help=f"running batch sizes (default: {','.join(map(str, DEFAULT_BATCH_SIZES))})")
    p.add_argument("--prompt-lens", default=",".join(map(str, DEFAULT_PROMPT_LENS)), metavar="P,P,...",
                   help=f"prompt lengths in tokens (default: {','.join(map(str, DEFAULT_PROMPT_LENS))})")
    p.add_argument("--length", type=int, default=256, help="tokens each request generates (default: 256)")
    p.add_argument("--window", type=int, default=16, help="tokens per timed window (default: 16)")
    p.add_argument("--repeats", type=int, default=2, help="times the grid is measured (default: 2)")
    p.add_argument("--model-dir", default=str(task.MODEL_DIR), metavar="DIR", help="model folder (default: the reference model)")
    p.add_argument("--max-model-len", type=int, default=1024, help="vLLM's context limit (default: 1024)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU engine: KV-cache size in GiB (default: 1)")
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="N >= 2: measure how much slower N engine instances run beside each other on this host, against "
                        "the one-instance profile --out names, into <stem>_layout<N>.json beside it (real_backend/layout.py; "
                        "what the simulated twin of an N-instance world prices); --length and --repeats apply")
    p.add_argument("--speculating", action="store_true",
                   help="measure an engine started with n-gram speculation (what spec_tail and tlt run on), drafting "
                        "off, against the profile --out names, into <stem>_layout<N>_speculating.json (vLLM runs such an "
                        "engine without async scheduling: its plain steps are slower than the profile's)")
    p.add_argument("--shared-host", action="store_true",
                   help="measure how much slower the engine decodes beside a GRPO update on the trainer's thread, and "
                        "the update beside the engine, into the profile --out names (measured_by.shared_host: what the "
                        "twin of a mode that trains beside the rollout on this host prices; real_backend/host_sharing.py); "
                        "--length, --repeats and --group-size apply (~1-2 minutes)")
    p.add_argument("--trainer-process", action="store_true",
                   help="with --shared-host: the trainer's passes in a process of their own, as `lssim real "
                        "--trainer-process` runs them")
    p.add_argument("--group-size", type=int, default=4, metavar="G",
                   help="with --shared-host: responses per group, the piece a hybrid run streams into the update as "
                        "each group finishes (default: 4)")
    p.add_argument("--cpus", metavar="C|C|...", help="with --instances: the CPUs each instance's threads are bound to, "
                   "'|' between instances (e.g. 0|1; default: vLLM's own binding)")
    p.add_argument("--trainer", action="store_true", help="profile the GRPO trainer's phases instead (log-prob, update, "
                   "weight push) and fit lssim.sim.training.ProfiledTrainCost: real_backend/profile_trainer.py, which takes "
                   "--out, --model-dir and --repeats from here (its other options: python -m real_backend.profile_trainer -h)")


def int_list(text: str, flag: str) -> list[int]:
    """`text` as sorted distinct integers >= 1 (comma-separated); ValueError naming `flag` otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: expected integers >= 1")
    return sorted(set(values))


def _relative(path: str) -> str:
    """A path relative to the working folder where it is inside it (profiles are shipped in the repo)."""
    from pathlib import Path

    p = Path(path).resolve()
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".replace("  ", " ")


__all__ = ["measure", "fit", "measurement_files", "profile_engine", "run", "add_arguments"]
