"""Toy environments for the `environment_factory` tests (imported by `test_environments.py` and its launched script).

An episode's `reset` draws a target digit from the instance's own generator, so every draw of a prompt gets an
episode of its own, appends it to the prompt as the observation (`" l7:"`), and the environment owns a reward read from
that state (`get_reward`). A second reward, a plain reward function, reads the episode through TRL's `environments`
keyword. Each kept row can then be checked against its own episode: the target is in the prompt it was generated from.
"""

import random

from datasets import Dataset

from trl_ada.tasks.arithmetic import make_problems

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}{{ call.function.name }}{{ call.function.arguments | tojson }}"
    "{% endfor %}{% endfor %}"
)
"""The character tokenizer has no chat template; environments need conversational prompts, and GRPOTrainer requires
one that can render tool calls (these environments expose no tools)."""

RESETS: list[tuple[str, int]] = []
"""(environment, target) of every `reset` in this process."""
SCORED: list[int] = []
"""One entry per completion `target_reward` scored in this process."""


class Game:
    """Base of the toy environments; `kind` is the observation's letter."""

    kind = "g"
    created = 0

    def __init__(self) -> None:
        Game.created += 1
        self._rng = random.Random(f"{type(self).__name__}-{Game.created}")
        self.target = -1

    def reset(self, **row) -> str:
        self.target = self._rng.randrange(10)
        RESETS.append((type(self).__name__, self.target))
        return f" {self.kind}{self.target}:"

    def get_reward(self) -> float:
        return self.target / 10


class Low(Game):
    kind = "l"


class High(Game):
    kind = "h"

    def get_reward(self) -> float:
        return 1 - self.target / 10


def completion_text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def target_reward(completions, environments, **kwargs):
    """1 when the completion starts with a digit below its own episode's target."""
    SCORED.extend(range(len(completions)))
    texts = [completion_text(c) for c in completions]
    return [1.0 if t[:1].isdigit() and int(t[:1]) < env.target else 0.0 for t, env in zip(texts, environments)]


def expected_rewards(prompt_text: str, completion_text_: str) -> dict[str, float]:
    """What each reward must be for a row generated from `prompt_text` (which ends with its episode's observation)."""
    kind, target = prompt_text[-3], int(prompt_text[-2])
    first = completion_text_[:1]
    rewards = {"target_reward": 1.0 if first.isdigit() and int(first) < target else 0.0}
    rewards["Low" if kind == "l" else "High"] = target / 10 if kind == "l" else 1 - target / 10
    return rewards


def reset_counters() -> None:
    RESETS.clear()
    SCORED.clear()
    Game.created = 0


def dataset(num_problems: int, *, routed: bool) -> Dataset:
    """Arithmetic prompts as conversations; with `routed`, an `environment` column alternates between the two."""
    problems = make_problems(num_problems, seed=0)
    rows = {
        "prompt": [[{"role": "user", "content": p["prompt"]}] for p in problems],
        "answer": [p["answer"] for p in problems],
    }
    if routed:
        rows["environment"] = ["low" if i % 2 == 0 else "high" for i in range(num_problems)]
    return Dataset.from_dict(rows)
