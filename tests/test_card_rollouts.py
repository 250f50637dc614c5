"""`trl_ada.reporting.card.describe_rollouts`: the card's phrases from GRPOTrainer's `tools`, `environment_factories` and
`rollout_func` attributes (the trainer passes them as they are; the environment case end to end is
tests/test_environments.py's)."""

from trl_ada.reporting.card import describe_rollouts


def add(a: int, b: int) -> int:
    return a + b


class Calculator:
    pass


def my_rollout(prompts, trainer):
    return {}


def test_a_plain_run_has_no_phrase():
    assert describe_rollouts(tools=None, environment_factories=None, rollout_func=None) == []
    assert describe_rollouts(tools=[], environment_factories={}, rollout_func=None, vision=False) == []


def test_each_kind_of_rollout_is_named_by_its_objects_names():
    phrases = describe_rollouts(
        tools=[add],
        environment_factories={"a": Calculator, "b": Calculator},
        rollout_func=my_rollout,
        vision=True,
    )
    assert phrases == [
        "tool calls (`add`) in TRL's tool loop, tool output masked out of the loss",
        "environment episodes (`Calculator`), one fresh `reset` per completion drawn, scored when the episode ended",
        "a custom rollout function (`my_rollout`)",
        "image prompts (a vision-language model)",
    ]
