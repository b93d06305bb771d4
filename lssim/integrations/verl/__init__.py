"""lssim in verl: an lssim policy chooses verl's prompts, group sizes and budgets, and verl's run is recorded as an
lssim trace.

Built against verl 0.9.1, read from its PyPI wheel (verl-0.9.1-py3-none-any.whl, sha256
db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14; the repository is github.com/verl-project/verl,
formerly volcengine/verl, whose stored snapshot here stops at 0.8.0.dev and has no v1 trainer). Every name below
was checked in that source; each module's docstring cites the file it follows.

verl's v1 trainer (`trainer.use_v1=true`, verl/trainer/ppo/v1/) has four plug points that matter here, all used:

    trainer.v1.sampler.custom_sampler.{path,name}   sampler.LssimSampler: `sample(global_steps, partition_id,
                                                    batch_size)` decides when a step's rollout ends and which
                                                    finished groups train, and records the trace
    data.custom_cls.{path,name}                     dataset.LssimDataset: the rows verl's data loader fetches
                                                    are the policy's plan (prompt, `__rollout_n__`, budget)
    actor_rollout_ref.rollout.agent.agent_loop_config_path   agent_loop.LssimSingleTurnAgentLoop: the row's
                                                    budget as the request's max_tokens; why the response ended
    (verl's own) `__rollout_n__` row field          the group size, read by AgentLoopWorkerTQ._run_prompt

What the issue assumed and verl 0.9.1 really has: the custom sampler and its `sample(global_steps, partition_id,
batch_size)` signature exist as named (it returns `(KVBatchMeta, metrics)` and is built with `trainer_mode,
trainer_config, max_off_policy_threshold, max_off_policy_strategy, sampler_kwargs, refill_fn`), and so does
`agent_loop_config_path`. But the sampler does not choose prompts: it picks among groups already generated, and
`refill_fn(n)` can only ask verl's data loader for n more rows, whose sampler is not configurable in 0.9.1. So the
prompts and group sizes are chosen by a custom dataset (`data.custom_cls`), a third plug point, and per-request
budgets by a custom agent loop, reading fields of the dataset's rows.

`python -m lssim.integrations.verl config --policy SPEC --trace PATH --out DIR` prints the overrides and writes the
agent-loop YAML. The modules import verl only where they subclass its classes (dataset, agent_loop) or talk to
TransferQueue (sampler, by default); records, recorder and driver run without verl.
"""

VERL_VERSION = "0.9.1"  # the verl release these modules were read from and tested against
