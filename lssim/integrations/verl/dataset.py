"""`LssimDataset`: verl's RLHFDataset, serving the rows an lssim policy planned (`data.custom_cls`).

verl 0.9.1 (PyPI wheel verl-0.9.1, sha256 db6e6f2a8d9d5808...): `verl/utils/dataset/rl_dataset.py`,
`get_dataset_class`, loads `data.custom_cls.{path,name}` (a file path or `pkg://module.path`; the class must
subclass torch's Dataset) and `verl/trainer/ppo/utils.py`, `create_rl_dataset`, builds it as
`cls(data_files=..., tokenizer=..., processor=..., config=data_config, max_samples=...)` -- for the train files and
again for the validation files. Its rows reach the rollout unchanged: `AgentLoopWorkerTQ._run_prompt`
(verl/trainer/ppo/v1/agent_loop_tq.py) pops `__rollout_n__` as the group's size (its comment: "user can dynamically
adjust n for each sample here, e.g according to task difficulty"), every other field becomes a keyword argument of
the agent loop's `run` and a field of the trajectory in TransferQueue.

For each row verl's data loader fetches from the train dataset, this one ignores the loader's index and returns
the next group the run's policy planned (driver.PolicyDriver.next_group): the planned prompt's own row, plus
    lssim_prompt_id   the prompt's row number (lssim's prompt id; the recorder reads it back from TransferQueue)
    __rollout_n__     the group size the policy chose
    lssim_max_tokens  the response budget the policy chose (lssim's agent loop passes it to the server)
The validation dataset serves its rows as verl's does. verl must build the dataset in the trainer's process
(`data.dataloader_num_workers=0`), where lssim's sampler started the run.
"""

from __future__ import annotations

from typing import Any, Callable

from lssim.integrations.verl.driver import PolicyDriver, get_run
from lssim.integrations.verl.records import BUDGET_FIELD, PROMPT_ID_FIELD, ROLLOUT_N_FIELD


def planned_row(driver: PolicyDriver, row_at: Callable[[int], dict]) -> dict:
    """The next planned group as a dataset row: `row_at(prompt_id)` is the prompt's own row."""
    spec = driver.next_group()
    row = dict(row_at(spec.prompt_id))
    row[PROMPT_ID_FIELD] = int(spec.prompt_id)
    row[ROLLOUT_N_FIELD] = int(spec.n_samples)
    row[BUDGET_FIELD] = int(spec.max_tokens)
    return row


def _as_list(files: Any) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]  # a list, or OmegaConf's ListConfig


def is_train_files(data_files: Any, data_config: Any) -> bool:
    """verl builds the same class for train and validation files; the train one is the one the policy drives."""
    return _as_list(data_files) == _as_list(data_config.get("train_files"))


try:  # the class exists where verl does; the functions above are all that needs testing without it
    from verl.utils.dataset.rl_dataset import RLHFDataset
except ImportError:  # verl not installed: lssim itself never needs this class
    RLHFDataset = None

if RLHFDataset is not None:

    class LssimDataset(RLHFDataset):
        """verl's RLHFDataset whose train rows are the lssim policy's plan (see the module docstring)."""

        def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
            super().__init__(data_files=data_files, tokenizer=tokenizer, config=config, processor=processor,
                             max_samples=max_samples)
            self.lssim_driver = None
            if is_train_files(data_files, config):
                driver = get_run(str(config.get("lssim_run", "lssim")))
                if driver.pool is None:  # verl builds the train dataset first: a later one on the same files is validation
                    self.lssim_driver = driver
                    driver.attach_pool(super().__len__())

        def __getitem__(self, item):
            if self.lssim_driver is None:
                return super().__getitem__(item)
            return planned_row(self.lssim_driver, super().__getitem__)
