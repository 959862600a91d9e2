"""The sampler settings of an eval or a corpus run: the length policy over the task's or the model's defaults.

Its own module so that both the eval runner and the corpus mode (which the runner calls for
--attention-stats) import it without importing each other.
"""
from __future__ import annotations

from sinklens.eval.tasks import get_task
from sinklens.samplers.registry import get_config


def sampler_settings(model, task_name: str | None, gen_length: int | None = None, task_length: int | None = None,
                     sampler: str | None = None, **overrides) -> tuple[dict, list[str]]:
    """(settings, notes) of the model's sampler for a task, from the length policy
    (`sinklens.samplers.lengths`): a sinklens twin's training settings, else the task's answer
    length (`task_length`, default: the task table's) or the paper's length for it, with the
    paper's settings; `gen_length` and `overrides` (by field name) on top. `sampler`: one of the
    family's other samplers (default: its own). Checked by the sampler config now, so a bad
    setting fails before anything is written."""
    from sinklens.samplers import lengths

    return planned_settings(get_config(sampler or model.family.sampler), lengths.ModelFacts.of(model), task_name,
                            gen_length, task_length, overrides)


def planned_settings(cls, facts, task_name: str | None, gen_length: int | None, task_length: int | None,
                     overrides: dict) -> tuple[dict, list[str]]:
    """`sampler_settings` for sampler config `cls` on a model known by its `lengths.ModelFacts`
    (before it is loaded, the context unknown: the command line's checks)."""
    from sinklens.samplers import lengths

    if task_length is None and task_name is not None:
        task_length = get_task(task_name).gen_length
    plan = lengths.settings(cls, facts, task=task_name, task_length=task_length, length=gen_length, overrides=overrides)
    try:
        plan.config()
    except TypeError as e:  # a flag of another sampler: a bad setting like any other
        raise ValueError(str(e)) from None
    return plan.values, plan.deprecated + plan.notes
