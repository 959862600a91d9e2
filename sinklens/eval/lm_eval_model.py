"""lm-evaluation-harness model type `sinklens`: any sinklens model, its own sampler, sinks masked.

    python -m sinklens.eval.lm_eval_model --model sinklens \\
        --model_args pretrained=PATH_OR_ALIAS,mask_topk=1 \\
        --tasks sinklens_gsm8k_cot --include_path sinklens/eval/lm_eval_tasks

runs lm-eval's own command line with this model registered (lm-eval has no plugin discovery, so
the plain `lm_eval` command does not know `sinklens`; from Python, `import
sinklens.eval.lm_eval_model` first, then `lm_eval.simple_evaluate(model="sinklens", ...)`).

model_args: pretrained, gen_length (tokens to generate, any sampler; default: the length policy's,
`sinklens.samplers.lengths`: a sinklens twin's training length, else the request's max_gen_toks
rounded up to what the sampler can generate, e.g. whole LLaDA blocks), dtype, device, seed
(generation and the random-key control); every field of `MaskingConfig`
(sinklens/masking/config.py), by its name, with a `mask_` prefix (mask_sinks=topk) or by an old
flag name it declares (eps, with a deprecation warning), parsed and checked by the field's own
type and range, defaults the field's; and every field of the model's sampler config (e.g. steps,
block_length, alg; `sinklens/samplers/<name>/config.py`). A name both configs have goes to the
sampler (write the `mask_` form for the masking one). Any other name is an error. A request
longer than the model's context is refused before anything runs, in one line.
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
from sinklens.masking.config import MaskingConfig
from sinklens.masking.policy import SinkMaskingPolicy
from sinklens.params import parse_text
from sinklens.samplers.registry import get_config

# lm-eval's own model_args (it adds them for every model type), not settings of ours
LM_EVAL_ARGS = frozenset({"batch_size", "max_batch_size"})
UNSET = (None, "", "None", "none")


class ModelArgsError(ValueError):
    """Bad model_args or a request the model cannot take: `main` prints it as one line."""


def split_model_args(args: dict, sampler_cls) -> tuple[dict, dict]:
    """(MaskingConfig keywords, sampler keywords) from lm-eval's model_args, each value parsed and
    checked by its field's `param` metadata; the names are read off the two config classes."""
    sampler = {f.name: f.metadata for f in fields(sampler_cls) if "type" in f.metadata}
    masking = {f.name: f.metadata for f in fields(MaskingConfig) if "type" in f.metadata and f.name != "seed"}
    # a field's earlier command-line spellings (`--eps` for sink_eps), accepted with a deprecation warning
    old_names = {flag.lstrip("-").replace("-", "_"): name for name, meta in masking.items()
                 for flag in meta.get("old_flags") or ()}

    def parsed(name, value, meta):
        try:
            return None if value in UNSET else parse_text(name, value, meta)
        except ValueError as e:                 # "<field> must be ..., got ...": one line from main()
            raise ModelArgsError(str(e)) from None

    mask_kw, sampler_kw, unknown = {}, {}, []
    for key, value in args.items():
        bare = key[len("mask_"):] if key.startswith("mask_") and key not in masking else key
        if key in sampler:
            sampler_kw[key] = parsed(key, value, sampler[key])
        elif bare in masking:
            mask_kw[bare] = parsed(bare, value, masking[bare])
        elif key in old_names:
            warnings.warn(f"model_args {key}= is deprecated: use {old_names[key]}=", DeprecationWarning, stacklevel=3)
            mask_kw[old_names[key]] = parsed(old_names[key], value, masking[old_names[key]])
        elif key not in LM_EVAL_ARGS:
            unknown.append(key)
    if unknown:
        raise ModelArgsError(f"model_args {unknown} are not sinklens arguments: pretrained, gen_length, dtype, device, "
                             f"seed, the masking settings {sorted(masking)} (also as mask_<name>) and the "
                             f"{sampler_cls.name} sampler's {sorted(sampler)}")
    given = lambda kw: {k: v for k, v in kw.items() if v is not None}   # noqa: E731  (unset: the field's default)
    return given(mask_kw), given(sampler_kw)


@register_model("sinklens")
class SinklensLM(LM):
    def __init__(self, pretrained: str, gen_length=None, dtype=None, device=None, seed=0, **model_args):
        super().__init__()
        import torch

        from sinklens.models.loader import load
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            warnings.warn(f"device={device!r} (lm-eval's default) but CUDA is not available: using the CPU")
            device = None
        self.m = load(pretrained, dtype=dtype, device=device)
        if self.m.tokenizer is None:
            raise ModelArgsError(f"{pretrained!r} ships no tokenizer; lm-eval needs text in and out")
        self.sampler = get_config(self.m.family.sampler)
        if not self.sampler.generates:
            raise ModelArgsError(f"{pretrained!r} is a {self.m.family.name!r} encoder: it generates no text for lm-eval")
        masking, self.sampler_args = split_model_args(model_args, self.sampler)
        self.gen_length = None if gen_length in UNSET else int(gen_length)
        self.seed = int(seed)
        try:
            self.config = MaskingConfig(**masking, seed=self.seed)
        except ValueError as e:
            raise ModelArgsError(str(e)) from None
        self.policy = SinkMaskingPolicy(self.config, num_layers=self.m.num_layers,
                                        is_diffusion=self.m.is_diffusion, model=self.m)
        self.pretrained = str(pretrained)

    def _check_context(self, n_prompt: int, n_new: int) -> None:
        """One line before anything runs: GSM8K's 8-shot prompt alone is ~1900 tokens."""
        if self.m.max_length is not None and n_prompt + n_new > self.m.max_length:
            raise ModelArgsError(
                f"{self.pretrained}: a request needs {n_prompt} prompt + {n_new} new tokens, more than the model's "
                f"context of {self.m.max_length} tokens; use a model with a longer context (e.g. "
                "smollm2-135m-instruct), fewer shots (--num_fewshot) or a shorter generation (gen_length=N)")

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
        jobs = []                                   # (prompt ids, new tokens, stop strings), all checked first
        for req in requests:
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until") or []
            settings, _ = sampler_settings(self.m, None, self.gen_length, int(gen_kwargs.get("max_gen_toks", 256)),
                                           **self.sampler_args)
            ids = self._encode(context)
            self._check_context(len(ids), settings.get(self.sampler.length_field) or 0)
            jobs.append((ids, settings, [until] if isinstance(until, str) else list(until)))
        out = []
        for i, (req, (ids, settings, until)) in enumerate(zip(tqdm(requests, disable=disable_tqdm,
                                                                   desc="sinklens generate_until"), jobs)):
            text = generate_text(self.m, ids, self.policy, settings, seed=self.seed + i)
            cut = min((j for j in (text.find(s) for s in until) if j >= 0), default=len(text))
            out.append(text[:cut])
            self.cache_hook.add_partial("generate_until", req.args, text[:cut])
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if self.m.is_diffusion:
            raise NotImplementedError("loglikelihood: diffusion models have no exact likelihood; use "
                                      "generate_until tasks (sinklens scores ARMs only here)")
        pairs = [(self._encode(context), self._encode(context + continuation)) for context, continuation
                 in (req.args for req in requests)]
        for ctx, full in pairs:
            self._check_context(len(full), 0)
        out = []
        for req, (ctx, full) in zip(tqdm(requests, disable=disable_tqdm, desc="sinklens loglikelihood"), pairs):
            ll = reference_loglik(self.m, ctx, full[len(ctx):], self.config)
            out.append((ll["masked"], ll["greedy_masked"]))
            self.cache_hook.add_partial("loglikelihood", req.args, out[-1])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood_rolling is not supported by the sinklens model type")


def main() -> None:
    """lm-eval's own command line, with the `sinklens` model type registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    from sinklens.eval.lm_eval_task import missing_data
    reason = missing_data(sys.argv[1:])
    if reason is not None:   # said before the model loads, not as a `datasets` traceback after it
        print(f"sinklens-lm-eval: error: {reason}", file=sys.stderr)
        sys.exit(2)
    try:
        cli_evaluate()
    except ModelArgsError as e:
        print(f"sinklens-lm-eval: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
