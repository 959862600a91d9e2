"""Which tokens sinks sit on (paper Table 2: LLaDA `Ċ` 0.368, `<|mdm_mask|>` 0.366, `.` 0.050).

Every Eq. 3 sink occurrence (step, layer, head, position) counts once, on the token at that
position at that step. Tokens are grouped into categories by these rules, first match wins:

1. `mask`: the id is the model's mask id (`<|mdm_mask|>`, `<|mask|>`);
2. `special`: a special / EOS / pad id of the model, or a string like `<|...|>`, `<s>`, `</s>`, `[CLS]`;
3. `whitespace`: the decoded string is only whitespace — byte-level BPE `Ġ` (space), `Ċ` (newline),
   `ĉ` (tab) and SentencePiece `▁` count as whitespace;
4. `punctuation`: every character is Unicode punctuation or a symbol (`.`, `,`, `:`, `+`, …);
5. `other`.
"""
from __future__ import annotations

import csv
import io
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

CATEGORIES = ("whitespace", "punctuation", "mask", "special", "other")
_BPE_SPACE = str.maketrans({"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "▁": " ", "č": "\r"})
_SPECIAL = re.compile(r"^(<\|.*\|>|<[/]?s>|<[a-z_]+>|\[[A-Z]+\]|<unk>|<pad>)$")


def categorize(token: str, token_id: int, mask_id: int | None = None, special_ids=()) -> str:
    """Category of one token (rules in the module docstring)."""
    if mask_id is not None and int(token_id) == int(mask_id):
        return "mask"
    if int(token_id) in set(int(i) for i in special_ids) or _SPECIAL.match(token or ""):
        return "special"
    text = (token or "").translate(_BPE_SPACE)
    if text == "" or text.isspace():
        return "whitespace"
    if all(unicodedata.category(c)[0] in "PS" or c.isspace() for c in text):
        return "punctuation"
    return "other"


@dataclass
class TokenRow:
    token: str
    token_id: int
    category: str
    count: int
    fraction: float


@dataclass
class SinkTokenTable:
    """Sink occurrences per token and per category (fractions of all sink occurrences)."""

    rows: list[TokenRow]          # sorted by count, descending
    categories: dict[str, dict]   # category -> {"count", "fraction"}
    total: int                    # all sink occurrences (step, layer, head, position)

    def __repr__(self) -> str:
        top = ", ".join(f"{r.token!r} {r.fraction:.3g}" for r in self.rows[:5])
        return f"SinkTokenTable({self.total} sink occurrences, {len(self.rows)} tokens; top: {top})"

    def _repr_html_(self) -> str:
        return self.to_dataframe().head(10).to_html(index=False) + f"<p>{len(self.rows)} tokens; .to_dataframe() for all</p>"

    def to_dataframe(self):
        """pandas DataFrame: token, token_id, category, count, fraction (most frequent first)."""
        from sinklens.analysis.frames import token_frame

        return token_frame(self)

    def to_dict(self, top: int = 50) -> dict:
        return {"units": "fraction of all Eq. 3 sink occurrences (step, layer, head, position)",
                "total_sink_occurrences": self.total, "categories": self.categories,
                "tokens": [r.__dict__ for r in self.rows[:top]]}

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["token", "token_id", "category", "sink_occurrences", "fraction_of_sink_occurrences"])
        for r in self.rows:
            w.writerow([r.token, r.token_id, r.category, r.count, f"{r.fraction:.4f}"])
        return buf.getvalue()

    def to_markdown(self, top: int = 20) -> str:
        def show(s: str) -> str:
            return "`" + s.replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"

        lines = [f"Sink tokens (fraction of all {self.total} Eq. 3 sink occurrences over steps × layers × heads)", "",
                 "| token | id | category | occurrences | fraction |", "|---|---:|---|---:|---:|"]
        lines += [f"| {show(r.token)} | {r.token_id} | {r.category} | {r.count} | {r.fraction:.3f} |"
                  for r in self.rows[:top]]
        lines += ["", "| category | occurrences | fraction |", "|---|---:|---:|"]
        lines += [f"| {c} | {v['count']} | {v['fraction']:.3f} |" for c, v in self.categories.items()]
        return "\n".join(lines) + "\n"


def sink_token_table(token_ids: np.ndarray, decode, mask_id: int | None = None, special_ids=()) -> SinkTokenTable:
    """token_ids: (N,) the token under each sink occurrence; decode: ids -> strings."""
    ids, counts = np.unique(np.asarray(token_ids, dtype=np.int64), return_counts=True)
    return counted_token_table(ids, counts, decode, mask_id, special_ids)


def counted_token_table(ids: np.ndarray, counts: np.ndarray, decode, mask_id: int | None = None,
                        special_ids=()) -> SinkTokenTable:
    """The table from (K,) distinct token ids, ascending, and (K,) their sink occurrences."""
    total = int(counts.sum())
    strings = decode(ids.tolist()) if ids.size else []
    rows = [TokenRow(s, int(i), categorize(s, int(i), mask_id, special_ids), int(c), c / total)
            for i, s, c in zip(ids, strings, counts)]
    rows.sort(key=lambda r: (-r.count, r.token_id))
    cats = {c: {"count": 0, "fraction": 0.0} for c in CATEGORIES}
    for r in rows:
        cats[r.category]["count"] += r.count
    for c in cats.values():
        c["fraction"] = c["count"] / total if total else 0.0
    return SinkTokenTable(rows, cats, total)
