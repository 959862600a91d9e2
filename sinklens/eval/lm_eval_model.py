"""lm-evaluation-harness model type `sinklens`: any sinklens model, its own sampler, sinks masked.

    python -m sinklens.eval.lm_eval_model --model sinklens \\
        --model_args pretrained=PATH_OR_ALIAS,mask_topk=1 \\
        --tasks sinklens_gsm8k_cot --include_path sinklens/eval/lm_eval_tasks

runs lm-eval's own command line with this model registered (lm-eval has no plugin discovery, so
the plain `lm_eval` command does not know `sinklens`; from Python, `import
sinklens.eval.lm_eval_model` first, then `lm_eval.simple_evaluate(model="sinklens", ...)`).

model_args: pretrained, mask_topk (0 = unmasked), ranking, threshold, keep_self, step0, arm_rule
(as `sinklens eval`), gen_length (tokens to generate, any sampler; default: the length policy's,
`sinklens.samplers.lengths`: a sinklens twin's training length, else the request's max_gen_toks
rounded up to what the sampler can generate, e.g. whole LLaDA blocks), any field of the model's
sampler config (e.g. steps, block_length, alg; `sinklens/samplers/<name>/config.py`), dtype,
device, seed.
- generate_until: the family's own sampler with the masking policy as its step hook; the text
  is cut at the request's `until` strings.
- loglikelihood: ARMs only (exact, teacher-forced; sinks ranked by one unmasked pass, see
  sinklens.eval.loglik). DLMs have no exact likelihood: NotImplementedError.
"""
from __future__ import annotations

import warnings
from dataclasses import fields

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from sinklens.eval.lm_eval_task import TASK_DIR, task_yaml, write_task_yaml  # noqa: F401  (public here too)
from sinklens.eval.loglik import reference_loglik
from sinklens.eval.runner import generate_text, sampler_settings
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
from sinklens.samplers.configs import get_config, parse_text

def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


def _opt(v, cast):
    return None if v in (None, "", "None", "none") else cast(v)


@register_model("sinklens")
class SinklensLM(LM):
    def __init__(self, pretrained: str, mask_topk=0, ranking="per_head", threshold=None, keep_self=False,
                 step0="unmasked", arm_rule="newest", gen_length=None, dtype=None, device=None, seed=0,
                 batch_size=1, mask_sinks="topk", eps=3.0, mask_units="scaled_sum", mask_scope="all",
                 mask_control="none", **other):
        super().__init__()
        import torch

        from sinklens.models.loader import load
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            warnings.warn(f"device={device!r} (lm-eval's default) but CUDA is not available: using the CPU")
            device = None
        self.config = MaskingConfig(mask_k=int(mask_topk), threshold=_opt(threshold, float), ranking=ranking,
                                    keep_self=_bool(keep_self), step0=step0, arm_rule=arm_rule,
                                    sinks=mask_sinks, sink_eps=float(eps), units=mask_units, scope=mask_scope,
                                    control=mask_control, seed=int(seed))
        self.m = load(pretrained, dtype=dtype, device=device)
        if self.m.tokenizer is None:
            raise ValueError(f"{pretrained!r} ships no tokenizer; lm-eval needs text in and out")
        if not get_config(self.m.family.sampler).generates:
            raise ValueError(f"{pretrained!r} is a {self.m.family.name!r} encoder: it generates no text for lm-eval")
        self.policy = SinkMaskingPolicy(self.config, num_layers=self.m.num_layers,
                                        is_diffusion=self.m.is_diffusion, model=self.m)
        # the sampler's own fields (steps, block_length, ...); lm-eval's extras (max_batch_size, ...) are not ours
        self.sampler = get_config(self.m.family.sampler)
        names = {f.name: f for f in fields(self.sampler)}
        self.sampler_args = {k: parse_text(k, v, names[k].metadata) for k, v in other.items()
                             if k in names and v not in (None, "")}
        unknown = sorted(set(other) - set(names) - {"max_batch_size"})  # max_batch_size: lm-eval's own
        if unknown:
            warnings.warn(f"model_args {unknown} are neither sinklens nor {self.sampler.name} sampler arguments "
                          f"(those are {sorted(names)}); ignored")
        self.gen_length, self.seed = _opt(gen_length, int), int(seed)
        self.pretrained = str(pretrained)

    # --- chat template support (lm-eval --apply_chat_template) ------------------------------
    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template=False) -> str | None:
        return getattr(self.m.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return self.m.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                    add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        bos = self.m.tokenizer.bos_token
        special = not (bos and text.startswith(bos))       # a chat-templated context has its BOS already
        return self.m.tokenizer(text, add_special_tokens=special)["input_ids"]

    # --- requests -----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for i, req in enumerate(tqdm(requests, disable=disable_tqdm, desc="sinklens generate_until")):
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            settings, _ = sampler_settings(self.m, None, self.gen_length, int(gen_kwargs.get("max_gen_toks", 256)),
                                           **self.sampler_args)
            text = generate_text(self.m, self._encode(context), self.policy, settings, seed=self.seed + i)
            cut = min((j for j in (text.find(s) for s in until) if j >= 0), default=len(text))
            out.append(text[:cut])
            self.cache_hook.add_partial("generate_until", req.args, text[:cut])
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if self.m.is_diffusion:
            raise NotImplementedError("loglikelihood: diffusion models have no exact likelihood; use "
                                      "generate_until tasks (sinklens scores ARMs only here)")
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="sinklens loglikelihood"):
            context, continuation = req.args
            ctx = self._encode(context)
            full = self._encode(context + continuation)
            ll = reference_loglik(self.m, ctx, full[len(ctx):], self.config)
            out.append((ll["masked"], ll["greedy_masked"]))
            self.cache_hook.add_partial("loglikelihood", req.args, out[-1])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood_rolling is not supported by the sinklens model type")


def main() -> None:
    """lm-eval's own command line, with the `sinklens` model type registered."""
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()


if __name__ == "__main__":
    main()
