"""Fidelity: how far the simulator's prediction of a real run is from what the run measured.

    run = load_run("runs/validate/real/hadb")                 # run: a folder written by `lssim real`
    sim = replay_run(run, setup, prompts)                     # run: same policy, seeds, config, data loader
    steps, responses = compare(run, sim)                      # compare: per step and per response, predicted vs measured
    steps, noise = median_over_repeats(steps.assign(repeat=0))  # compare: with repeats, per-step medians and their spread
    table = fidelity_table(steps, responses)                  # compare: per policy, APE of makespan, finish order, tokens

The modules: run (a recorded run and its twin), compare (real against predicted), noise (the goal, and what an exact
model would score against the repeats), summary (per policy, what `lssim validate` reports), modes (per execution
mode, the twin's error beside an exact model's: `lssim validate --mode`), driver (the driver's price for a twin on a
shared host), pool (per policy, the error against an exact model's over several validation folders) and report
(markdown and plots). `lssim validate` (real_backend/validate_command.py) records the runs, replays them and prints these tables.
Nothing here needs vLLM. `python -m lssim.analysis.fidelity FOLDER` prints a validation folder's fidelity table,
`python -m lssim.analysis.fidelity --pool FOLDER...` the pooled table.
"""
