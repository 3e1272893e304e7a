"""Byte-level BPE (llama.cpp's ``LLAMA_VOCAB_TYPE_BPE``): pre-tokenizer regexes chosen by
``tokenizer.ggml.pre``, GPT-2 byte-to-unicode mapping, rank-ordered merges, a per-word cache.

Why the pre-tokenizer does not use ``\\p{L}``/``\\p{N}`` directly: llama.cpp classifies code points
with its own Unicode table (``unicode-data.cpp``), which is a different Unicode version from both
Python's ``unicodedata`` (14.0 on 3.11) and the ``regex`` module (16+); they disagree on ~9,000 code
points (new scripts, CJK extensions, new digits). To split text exactly as llama.cpp does, we embed
llama.cpp's classification as a run-length table and do what llama.cpp itself does for its
std::regex fallback: "collapse" every non-ASCII code point to one placeholder per class, then run
plain regexes whose ``\\p{..}`` classes are spelled as ASCII ranges plus the placeholder. The same
trick serves llama.cpp's hand-written splitters (gpt2, llama3), whose behaviour equals their regexes
(checked against llama.cpp on the fixture corpus). A digest of the table is checked against the
llama.cpp build in ``tests/test_tokenizer.py`` (via the fixtures), so drift is caught.
"""

from __future__ import annotations

import base64
import heapq
import logging
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import switches
from ..errors import ModelFileError
from .spm import SPACE

log = logging.getLogger("tallow.tokenizer")

# --------------------------------------------------------------------------------------------
# Code point classes, as llama.cpp's unicode table has them (generated from libllama's
# unicode_cpt_flags_from_cpt by `scripts/make_tokenizer_fixtures.py --emit-unicode-table`).
# Classes of non-ASCII code points: 0 other (undefined, control, format, separator that is not
# whitespace), 1 number, 2 letter, 3 punctuation, 4 mark, 5 symbol, 6 whitespace. ASCII code points
# are never looked up: the collapsed text keeps them as they are, as llama.cpp does.
# Encoding: zlib + base85 of varints, one per run, value = run_length * 8 + class.
# --------------------------------------------------------------------------------------------
_CLASS_RUNS_B85 = (
    "c-n1NeP~<P73bXdWFOxT=jMI1FVYjdNODnRb;ybXvZH{aI-s}-_&E)DS=M=J3aQhAX%leU6g1Ty!NlO16k2zML`{Zgy5VUpb"
    "Xp9-TObt_j7A~V_D5?dw5A!USYXu_wkyXQD~$8F@80{)J?D4Mx#yg>gx%}V%^qhqWdeJ43Tlcj%673Th!%*t+jHuC;s6zN4y"
    "HR3!jKV0J;fVDie<pXfM}q|Rw!18q<d?`lwtguFwQJRJl6m(VqS!>DNOq$!%%~~2Y%Gxiye$+QS=*@h#7v+rY}j#oA4KqwZK"
    "U_>CciQh6qu~?Fz)`5$e*Ud=+cpN`@!mYar5vp*r~^;3ZPgTzVO3cGNO`Rst9E(vTIvL8MMZa+;NvbZL%z1_mwZ8+M<9&!vl"
    "LZ=26(ljNB66sN;85u_R43UW5$;xGnrn<=4$4WWy!q*I2H#6*Vn<NxS;$g-s`<8G@Hv~Pq{Ogll0IEHeX;TTTPIprlC7h{s9"
    "_~dhk;>o;HQw1zRTY!=o%UBqcRJQeG*npre+h!SksN^9}N&#0KXz=k^8)=PL4?j`i1^Ivi@Ro9w+E@T*4U{od4m#ZHM~*`&U"
    "s`Ouq;VtbiNPV}n@gk(FoBAb;wU$cP?=D(Ec!B1BsBc0U}0<DRS>*QQ7eyS;#~t~B~Icsf`|A%w0nD$m<G89)Zd$qMO^9{*<"
    "ftqH06HGt`MYgDjS4tS{RWkLTaoLHO!L#u3y2Lre2G>bf3HmP6>{uDgl|6Y~wM(W}&+drqj?vyYiU@h!qyWH46)1jZY}^t?{"
    "xpO+qvzD3^Z9PyN6}?x$*jOu||qoW?8qNDJ_^ciIz<={G?p#x{soht&6-H%Jwd(p=V_!mm{n+Nbx^z4D)MQA@VSCCEGe{^Li"
    "En&>v+dBfiz=W@}qveW7HouFSP=5VG#Wblcc%ie<sPjkbi@e-fbD?1f<l^toBSN6531#(%#K|#Yo91KTf8p9J|spd959sdJ7"
    "67PN&#98r7cM-a%><gRJ51TmQ%#o=}WXh&J)E-rb6Z=$JDvF2`cI5Fy4;61|#va?d^=R}im|yI;4L@9h&$avdZ{XHrFMR`Zn"
    ")v{Zy|e4L@IZ^s5c7ja<qW}(JC?imMO-5u?J~FHv!-Pzo8(m}4B~fbn*4*%*NOeiJoyCh<G}a_VjX6nJ0y&*WA-!Ra6e1fy9"
    "{Qd3YldGSv|la@dm+W0PWq!OXNBk6D4>6=--Ef;^i6QuacK%tkTc58GZ9h>a1#oCNVc<s06-o1zIG=o?<PqD!Om&&8@<)UG1"
    "<-dVK4m-h>kHAde`d$sX?X^`y#LG-oYnmmz2RsmqWKQD$&|1BT2hJU_-Z!HKoVxwA-p&rI-9KcO<_Tp`HwDv4yY3SsIlXk6V"
    "{D`8PiZ$i*Kku-zWNLqz2z2%Mu5ii=_V&@Q3XHw;AV7v<6tafEyZ$2XH9V=vTJQ1gSR7_wydD^vQqhk(=(0Ih0fs!sOT1FJf"
    "sh(*#mYRmQ3BIJ#3Yjpy1Xj@tiM=A~n_;sKA;Cl)m>T!j0?rl$8FUWdfit!|g>_YZK}ml_zBo@Bo$-+O6>*M!q|L$3Fuvf3z"
    "mvO!&!e(=R-59Vf>$ED3uWlacf~6t8E*nImA-klXPq>=+NKasJ!>Ra*2dTgd}XVkZNJ~tt7f4BBl(+<#yY{_B|R-EZV*+@s8"
    "m&n9jt;q(1P6IqSi(g-&27;ht(m@iu#)7?KFM@@*6^3wBoUdO4Ut}uE!5&p3H2*P8FD4MUodAV0nA?7b=>wzXI~$BE%0aKqf"
    "jqPz==c54A<@%%Ya*E0b8xUopOgHWG_T<Bslbf=_c5IJvub1yosxu8?IIxB}`5yUW^z{oXgg4T~0Ho8+X4QGTWd89(Kg$vO0"
    "+)S|gX!cAImOWL_eG{!8SG8)3GFtz}y>73rn4SrACDo@HEqb$`Tr{jJq_MOs?*2B`@uIcfFC9_WQ4lb*^80qy*WIT8eO4>Cr"
    "7**(Li)7`I-$TTjCnfC?gy@)`I{PLx$n%t?{1vSM@`Cr{kQltpHpm5brK6<31><?u67ovf8uX(jW9o`pp@P4n=VevN%PQ3T4"
    "$!C8NS4N);5mA-Nv4(T-ZM2lb8KbDFfNlJ9HPA=Ux8z)^7lUAx!ZaheueZq94*XJp7T>_wNoNVwN9#5xMD6s%*?2an7{?1>^"
    "keO1nAT+;VztE^?{X+Z#%Getjs^V2D2UJnbH$Q;OPtNEvUwBzpdAz8C7#t!nJhtQ%Y%)jg+)(Z%>4Y5g!L|8RCmj>@DfPgXm"
    "I6L-#nnp=DwdMP2!dk6Dvz|021{(RDKX;ji_`ma`X)Df%U-200nYZ8%rvq0teaaE3FZQdq3`3-UK2Z$ROC=V#gnJ4RNC{6b5"
    "H`*TBf_CCb!YD@5j?uzx!t1zyf)j;7R_z;%^Sk={Ufa<w2f~Qoh2XR(cjVP}s8=xYu(%BirvMp;MYFmFt|98yGpJ_AR4Xx+0"
    "c8H(ncJEXYFBA{8AeCMcS-b=?+xBa`sa+(z*ttoZ?4a~LDvDMU_(j+tF+VPf;SGrSE8iPbidBx|GM9(5w@F#gQcwBvV&A8l*"
    "d=y<rhi4m%kw;fjdm@dDk(?R3Dsp%)O*-%g4_H5q4uin#mE-lD9%DWsBD{sE1G>zenGtJ9pkUb*YGv`6&ZPMj^5N%nAP^tj6"
    "Jz;z3bKiZw{OnoYhY6K_K<4C#IhDZfUvWsaqs>AEbRxziyA8moGR+GxrG|$emXQk7nNK!c}dF_$#^6U#%jkzfMw3As4<Rle2"
    "%)rkan<FG6$o{L_v1Nxbw^QvBr4WO_&O^B?^icHUN6"
)

# The placeholder each class collapses to: llama.cpp's own choice (0xD0..0xD5 for categories,
# vertical tab for non-ASCII whitespace, so that a C-locale `\s` matches it).
_PLACEHOLDERS = np.array([0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0x0B], dtype=np.uint32)
_N_CODEPOINTS = 0x110000
_class_table: np.ndarray | None = None


def codepoint_classes() -> np.ndarray:
    """The uint8 class of every code point (built once, ~2 ms, 1.1 MB)."""
    global _class_table
    if _class_table is None:
        raw = zlib.decompress(base64.b85decode("".join(_CLASS_RUNS_B85)))
        lengths: list[int] = []
        classes: list[int] = []
        value = shift = 0
        for byte in raw:
            value |= (byte & 0x7F) << shift
            if byte & 0x80:
                shift += 7
                continue
            lengths.append(value >> 3)
            classes.append(value & 7)
            value = shift = 0
        table = np.repeat(np.array(classes, dtype=np.uint8), np.array(lengths, dtype=np.int64))
        if table.shape[0] != _N_CODEPOINTS:  # a corrupted constant: a bug in tallow, not user input
            raise RuntimeError(f"tallow's unicode class table covers {table.shape[0]} code points, not {_N_CODEPOINTS}")
        table.setflags(write=False)
        _class_table = table
    return _class_table


def collapse(text: str) -> str:
    """Map every non-ASCII code point to its class placeholder; same length as `text`.

    Offsets in the collapsed string are code point offsets in `text`, so regex spans found on
    the collapsed string slice the original text directly.
    """
    if text.isascii():
        return text
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    out = np.where(cps < 0x80, cps, _PLACEHOLDERS[codepoint_classes()[cps]])
    return out.astype("<u4").tobytes().decode("utf-32-le")


# Character-class bodies over the collapsed alphabet (see llama.cpp unicode.cpp, k_ucat_map).
_L = r"A-Za-z\u00d2"
_N = r"0-9\u00d1"
_P = r"\u00d3!-#%-*,-/:;?@\[-\]_{}"
_WS = r"\t\n\x0b\x0c\r "  # C-locale isspace; Python's \s would also match \x1c-\x1f

_GPT2 = (
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_WS}{_L}{_N}]+"
    rf"|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)
_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    rf"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}| ?[^{_WS}{_L}{_N}]+[\r\n]*"
    rf"|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)
_QWEN2 = (
    rf"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_WS}{_L}{_N}]+[\r\n]*"
    rf"|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)

# Each family is the list of regexes llama.cpp applies in turn (llm_tokenizer_bpe's constructor);
# every regex splits each piece the previous one produced, keeping unmatched gaps as pieces.
_STAGES: dict[str, tuple[str, ...]] = {
    "default": (rf"[{_P}$+<=>^~|]+", _GPT2, rf"[{_N}]+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "starcoder": (rf"[{_N}]", _GPT2),
    # Gemma 4 runs its merges over whole lines of "▁"-escaped text: llama.cpp only splits runs of
    # newlines from the rest (no merge may contain a newline).
    "gemma4": (r"[^\n]+|\n+",),
}


@dataclass(frozen=True)
class PreTokenizer:
    """What `tokenizer.ggml.pre` selects: the regex family and the flags llama.cpp sets with it."""

    name: str
    family: str
    ignore_merges: bool = False  # a whole pre-token that is in the vocab is emitted as is
    add_bos: bool = False  # default for tokenizer.ggml.add_bos_token
    has_bos: bool = True  # False: llama.cpp clears the BOS id (chatglm)
    # SentencePiece-shaped BPE (gemma4): spaces become "▁", merges run on raw UTF-8 characters
    # instead of GPT-2 byte characters, unknown bytes fall back to "<0xXX>" tokens.
    spm_style: bool = False


def _family_table() -> dict[str, PreTokenizer]:
    table: dict[str, PreTokenizer] = {"default": PreTokenizer("default", "default")}
    for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"):
        table[n] = PreTokenizer(n, "llama3", ignore_merges=True, add_bos=True)
    for n in ("dbrx", "smaug-bpe"):
        table[n] = PreTokenizer(n, "llama3")
    for n in ("glm4", "chatglm-bpe"):
        table[n] = PreTokenizer(n, "llama3", has_bos=False)
    for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
              "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
              "granite-docling", "exaone4"):
        table[n] = PreTokenizer(n, "gpt2")
    # "gpt2" is not a name llama.cpp accepts (it says "gpt-2"); we take it as the obvious alias.
    table["gpt2"] = PreTokenizer("gpt2", "gpt2")
    for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open", "megrez"):
        table[n] = PreTokenizer(n, "qwen2")
    # llama.cpp forces "gemma4" for tokenizer.ggml.model=gemma4 whatever the file says.
    for n in ("gemma4", "granite-embed-multi-311m"):
        table[n] = PreTokenizer(n, "gemma4", add_bos=True, spm_style=True)
    for n in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"):
        table[n] = PreTokenizer(n, "starcoder")
    return table


PRE_TOKENIZERS: dict[str, PreTokenizer] = _family_table()


def pre_tokenizer_for(pre: str | None, path: str = "model") -> PreTokenizer:
    """Resolve `tokenizer.ggml.pre` the way llama.cpp does.

    A missing value falls back to the default regexes with a warning (llama.cpp: "GENERATION
    QUALITY WILL BE DEGRADED"); an unknown value is an error, as in llama.cpp, because guessing a
    pre-tokenizer silently produces different ids.
    """
    if not pre:
        log.warning("%s: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer as llama.cpp does "
                    "(tokenization may not match the original model)", path)
        return PRE_TOKENIZERS["default"]
    found = PRE_TOKENIZERS.get(pre)
    if found is None:
        raise ModelFileError(
            f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}."
        )
    return found


_compiled: dict[str, tuple[re.Pattern[str], ...]] = {}


def _stages(family: str) -> tuple[re.Pattern[str], ...]:
    if family not in _compiled:
        _compiled[family] = tuple(re.compile(p) for p in _STAGES[family])
    return _compiled[family]


def split_words(text: str, family: str) -> list[str]:
    """Pre-tokenize `text` into words (llama.cpp's unicode_regex_split, before byte encoding)."""
    if not text:
        return []
    collapsed = collapse(text)
    spans = [(0, len(text))]
    for pattern in _stages(family):
        out: list[tuple[int, int]] = []
        for start, end in spans:
            last = start
            for m in pattern.finditer(collapsed, start, end):
                s, e = m.span()
                if s > last:
                    out.append((last, s))
                out.append((s, e))
                last = e
            if last < end:
                out.append((last, end))
        spans = out
    return [text[s:e] for s, e in spans]


# --------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode mapping: printable latin-1 bytes map to themselves, the other 68 bytes to
# U+0100.. in byte order, so every byte sequence is a string of visible characters.
# --------------------------------------------------------------------------------------------
def _byte_to_char() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR: list[str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_BYTECHARS = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """UTF-8 bytes of `word`, each shown as its GPT-2 byte character."""
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTECHARS)


class BpeTokenizer:
    """Encodes raw text (no special tokens inside) to ids, exactly as llm_tokenizer_bpe_session."""

    _CACHE_LIMIT = 200_000

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str], pre: PreTokenizer):
        self.token_to_id = token_to_id
        self.pre = pre
        # Key merges by their own "left right" string: the left part of a pair never contains a
        # space, so looking up f"{left} {right}" finds exactly the merge llama.cpp splits at its
        # first space after index 0. Iterating in reverse keeps the lowest rank of duplicates
        # (llama.cpp's emplace keeps the first).
        n = len(merges)
        self.ranks: dict[str, int] = dict(zip(reversed(merges), range(n - 1, -1, -1)))
        self._cache: dict[str, list[int]] = {}
        self._byte_ids: list[int | None] = [token_to_id.get(f"<0x{b:02X}>") for b in range(256)]
        # TALLOW_TOKENIZER_CUTS=0: merge whole lines, as llama.cpp does (the reference; slower).
        cuts = pre.spm_style and switches.enabled("TALLOW_TOKENIZER_CUTS")
        self._chunk_boundary = self._safe_boundaries(merges) if cuts else None

    @staticmethod
    def _safe_boundaries(merges: Sequence[str]) -> re.Pattern[str]:
        """Where a line of escaped text can be cut without changing its merges (as spm.py does).

        Gemma 4 merges a whole line at once, which costs ~35 µs a token on a long line. A cut just
        before a "▁" that follows a character c is safe when no merge ever produces a symbol holding
        c + "▁" (for Gemma 4 only ">" does): no merge can cross it, so each side merges in the
        same order as in the whole line. Checking merge products, not vocab entries, keeps this
        exact even for a file whose merges make symbols outside its vocabulary. ~0.2 s at load.
        """
        products = "\x00".join(merges).replace(" ", "")
        unsafe = "".join(re.escape(c) for c in sorted(set(re.findall(f"([^{SPACE}\x00]){SPACE}", products))))
        return re.compile(f"(?<=[^{SPACE}{unsafe}])(?={SPACE})")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        spm_style = self.pre.spm_style
        if spm_style:
            text = text.replace(" ", SPACE)
        words = split_words(text, self.pre.family)
        if self._chunk_boundary is not None:
            words = [chunk for word in words for chunk in self._chunk_boundary.split(word)]
        for word in words:
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._encode_spm_style(word) if spm_style else self._encode_word(byte_encode(word))
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> list[int]:
        vocab = self.token_to_id
        if self.pre.ignore_merges and word in vocab:
            return [vocab[word]]
        parts = self._merge(word)
        out: list[int] = []
        for part in parts:
            tid = vocab.get(part)
            if tid is not None:
                out.append(tid)
                continue
            # llama.cpp looks up each *byte* of the unknown symbol as a one-byte string; only
            # ASCII bytes can be vocab entries that way, the others are dropped.
            for b in part.encode("utf-8"):
                if b < 0x80:
                    tid = vocab.get(chr(b))
                    if tid is not None:
                        out.append(tid)
        return out

    def _encode_spm_style(self, word: str) -> list[int]:
        """One chunk of a line (or one run of newlines) of escaped text, as llama.cpp's gemma4 path."""
        vocab = self.token_to_id
        if word[0] == "\n" and word in vocab:  # a newline run that is a token is taken whole (llama.cpp PR 21343)
            return [vocab[word]]
        out: list[int] = []
        for part in self._merge(word):
            tid = vocab.get(part)
            if tid is not None:
                out.append(tid)
                continue
            # Unknown symbols are spelled byte by byte with "<0xXX>" tokens (dropped if absent).
            for b in part.encode("utf-8"):
                tid = self._byte_ids[b]
                if tid is not None:
                    out.append(tid)
        return out

    def _merge(self, word: str) -> list[str]:
        """Apply merges lowest rank first, leftmost first among equal ranks (llama.cpp's queue)."""
        n = len(word)
        if n < 2:
            return [word] if word else []
        ranks = self.ranks
        texts = list(word)
        if n == 2:
            return [word] if f"{word[0]} {word[1]}" in ranks else texts
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, int]] = []
        for i in range(n - 1):
            r = ranks.get(f"{texts[i]} {texts[i + 1]}")
            if r is not None:
                heap.append((r, i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            lt, rt = texts[left], texts[right]
            # Outdated entry: one side has since been merged into something else.
            if not lt or not rt or len(lt) + len(rt) != size:
                continue
            texts[left] = merged = lt + rt
            texts[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                r = ranks.get(f"{texts[before]} {merged}")
                if r is not None:
                    heapq.heappush(heap, (r, before, left, len(texts[before]) + len(merged)))
            if after >= 0:
                r = ranks.get(f"{merged} {texts[after]}")
                if r is not None:
                    heapq.heappush(heap, (r, left, after, len(merged) + len(texts[after])))
        return [t for t in texts if t]
