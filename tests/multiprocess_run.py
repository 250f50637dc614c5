"""Launched by tests/test_multiprocess.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Runs short trainings and writes, per rank, what the sampler decided at every step, so the test can check that
all processes agreed. Scenario `balance`: a normal seq_balance run. Scenario `sparse`: one prompt per generation batch,
`round_size=1` and a reward that never lets it retire, so every round has fewer requested rows than processes.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from conftest import (  # noqa: E402
    TINY_MODEL_KWARGS,
    env_reward,
    env_rollout,
    rollout_env_mask,
    rollout_feedback,
    shut_down_distributed,
    starts_low_digit,
    tiny_args,
)

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


def always_right(completions, **kwargs):
    return [1.0] * len(completions)


def fingerprint(completions, **kwargs):
    """A second reward (weight 0: decisions unchanged) that identifies each completion's text, to check routing."""
    return [(sum((i + 1) * ord(ch) for i, ch in enumerate(c)) % 9973) / 9973 for c in completions]


class Recording(AdaGRPOTrainer):
    def _log_selection(self, selection):
        self.__dict__.setdefault("selections", []).append(
            {
                "kept": [list(r.kept) for r in selection.prompts],
                "advantages": [list(r.advantages) for r in selection.prompts],
                "pools": [list(p) for p in selection.pools],
                "active_after_round": list(selection.active_after_round),
            }
        )
        super()._log_selection(selection)

    def _sample(self, inputs):
        self.__dict__.setdefault("drawn_prompts", []).append([row.get("prompt") for row in inputs])
        kept_inputs = super()._sample(inputs)
        moved = self._metrics["train"].get("ada/kept_rows_moved", [])
        self.__dict__.setdefault("moved", []).append(moved[-1] if moved else None)
        return kept_inputs

    def _generate(self, prompts):
        kept = self._ada_pending is not None
        output = super()._generate(prompts)
        if kept and self.rollout_func is not None:
            # The kept rows this process trains on, each with its own rollout's env_mask, extra field and reward.
            _, completion_ids, tool_mask, _, _, extra_fields, _, _ = output
            start = self.accelerator.process_index * len(completion_ids)
            rewards = self._ada_pending.rewards[start : start + len(completion_ids), 0].tolist()
            self.__dict__.setdefault("rollout_rows_line_up", []).append(
                tool_mask == [rollout_env_mask(ids) for ids in completion_ids]
                and extra_fields["feedback"] == [rollout_feedback(ids) for ids in completion_ids]
                and rewards == [1.0 if rollout_feedback(ids) == "solved" else 0.0 for ids in completion_ids]
            )
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        kept = self._ada_pending is not None
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if kept:
            self._kept_rewards = rewards
            if self._ada_pending.draw_shares is not None:
                self.__dict__.setdefault("draw_shares", []).append(self._ada_pending.draw_shares.tolist())
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.__dict__.setdefault("local_rows", []).append(int(output["completion_ids"].shape[0]))
        self.__dict__.setdefault("trained_advantages", []).append(output["advantages"].tolist())
        self.__dict__.setdefault("trained_tokens", []).append(output["completion_mask"].sum(dim=1).tolist())
        if len(self.reward_funcs) == 2:
            # Every row this process trains on must be the completion its reward was computed for: the fingerprint
            # reward was scored on the process that generated the row, before the row was routed here.
            local = output["completion_ids"].shape[0]
            start = self.accelerator.process_index * local
            texts = [
                self.processing_class.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                for ids, mask in zip(output["completion_ids"], output["completion_mask"])
            ]
            scored = self._kept_rewards[start : start + local, 1]
            expected = torch.tensor(fingerprint(texts), dtype=scored.dtype)
            self.__dict__.setdefault("rows_line_up", []).append(torch.equal(expected, scored))
        return output


def build(out_dir: Path, name: str, reward, extra: dict | None = None, **overrides) -> Recording:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    config = AdaGRPOConfig(**tiny_args(out_dir / name, **overrides))
    rewards = reward if isinstance(reward, list) else [reward]
    return Recording(
        model,
        rewards,
        args=config,
        processing_class=tokenizer,
        **({"train_dataset": make_dataset(64, seed=1)} | (extra or {})),
    )


def run(out_dir: Path, name: str, reward, extra: dict | None = None, **overrides) -> dict:
    trainer = build(out_dir, name, reward, extra or {}, **overrides)
    trainer.train()
    return {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "selections": trainer.selections,
        "local_rows": trainer.local_rows,
        "moved": trainer.moved,
        "trained_advantages": trainer.trained_advantages,
        "trained_tokens": trainer.trained_tokens,
        "draw_shares": trainer.__dict__.get("draw_shares"),
        "rows_line_up": trainer.__dict__.get("rows_line_up"),
        "rollout_rows_line_up": trainer.__dict__.get("rollout_rows_line_up"),
        "drawn_prompts": trainer.drawn_prompts,
        "checkpoint_files": sorted(os.listdir(checkpoint))
        if (checkpoint := out_dir / name / "checkpoint-2").is_dir()
        else [],
        "baseline_history": trainer.ada_sampler.state_dict().get("baseline_history"),
    }


def resume_from_local_disks(out_dir: Path, rank: int) -> dict:
    """
    Machines without shared storage: each process works in its own directory with the same relative `output_dir`, so
    only the main process's directory holds the model of a checkpoint. Resuming must fail on every process with one
    clear error (not on one process while the others wait in a collective).
    """
    machine = out_dir / f"machine{rank}"
    machine.mkdir()
    cwd = os.getcwd()
    os.chdir(machine)
    settings = dict(sampler="seq_balance", round_size=4, max_rounds=2, per_device_train_batch_size=4)
    try:
        build(
            Path("."), "disk", starts_low_digit, max_steps=1, save_strategy="steps", save_steps=1, **settings
        ).train()
        resumed = build(Path("."), "disk", starts_low_digit, max_steps=2, **settings)
        try:
            resumed.train(resume_from_checkpoint=True)
        except ValueError as error:
            return {"error": str(error), "main_has_checkpoint": Path("disk/checkpoint-1/trainer_state.json").exists()}
        return {"error": None}
    finally:
        os.chdir(cwd)


def main() -> None:
    out_dir = Path(sys.argv[1])
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    report = {
        "balance": run(
            out_dir,
            "balance",
            starts_low_digit,
            sampler="seq_balance",
            round_size=4,
            max_rounds=3,
            per_device_train_batch_size=4,
            max_steps=3,
        ),
        # Three prompts on two processes: a prompt's rows are generated on both, so kept rows must change process.
        "routing": run(
            out_dir,
            "routing",
            [starts_low_digit, fingerprint],
            reward_weights=[1.0, 0.0],
            sampler="seq_balance",
            round_size=2,
            max_rounds=4,
            per_device_train_batch_size=6,
            max_steps=3,
        ),
        # A rollout_func (agent episodes): its env_mask and extra fields must follow each row to the process training it.
        "rollout": run(
            out_dir,
            "rollout",
            env_reward,
            {"rollout_func": env_rollout},
            sampler="seq_balance",
            round_size=2,
            max_rounds=4,
            per_device_train_batch_size=6,
            max_steps=3,
        ),
        "est": run(
            out_dir,
            "est",
            starts_low_digit,
            sampler="est",
            est_max_samples=12,
            per_device_train_batch_size=8,
            max_steps=3,
        ),
        "dapo": run(
            out_dir,
            "dapo",
            starts_low_digit,
            sampler="dapo",
            dapo_max_refills=20,
            per_device_train_batch_size=4,
            max_steps=2,
        ),
        # Six prompts, so that later steps come back to prompts with a history: the tracked baselines (and so the
        # kept groups and advantages) must be the same on both processes.
        "tracked": run(
            out_dir,
            "tracked",
            starts_low_digit,
            {"train_dataset": make_dataset(6, seed=1)},
            sampler="dapo",
            baseline="tracked",
            scale_rewards="none",
            dapo_on_exhausted="keep_partial",
            per_device_train_batch_size=4,
            max_steps=5,
        ),
        # Every draw trained on: the rows vary per step, and must still split evenly over the processes and the
        # micro-batches of steps_per_generation, each routed to the process that trains it (the fingerprint reward).
        "pool": run(
            out_dir,
            "pool",
            [starts_low_digit, fingerprint],
            reward_weights=[1.0, 0.0],
            sampler="seq_balance",
            train_on="pool",
            round_size=2,
            max_rounds=4,
            per_device_train_batch_size=4,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            max_steps=2,
        ),
        # SPO draws each generation batch's prompts by priority from its tracker: both processes must draw the same
        # prompts, each its own slice of them, and remember the same pass rates.
        "spo": run(
            out_dir,
            "spo",
            starts_low_digit,
            {"train_dataset": make_dataset(8, seed=1)},
            sampler="spo",
            baseline="tracked",
            scale_rewards="none",
            normalize_advantages=True,
            num_generations=2,
            per_device_train_batch_size=4,
            max_steps=4,
        ),
        "sparse": run(
            out_dir,
            "sparse",
            always_right,
            sampler="seq_balance",
            num_generations=2,
            round_size=1,
            max_rounds=3,
            per_device_train_batch_size=1,
            max_steps=2,
        ),
    }
    report["local_disks"] = resume_from_local_disks(out_dir, report["balance"]["process_index"])
    (out_dir / f"rank{report['balance']['process_index']}.json").write_text(json.dumps(report))
    shut_down_distributed()  # every trainer is gone with `run`


if __name__ == "__main__":
    main()
