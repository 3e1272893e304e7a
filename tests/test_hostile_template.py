"""Chat templates from a GGUF are code: those that try to escape the sandbox, loop without end
or build huge values are stopped within a time and size bound, in one sentence."""

from __future__ import annotations

import time

import pytest

from tallow.chat.template import ChatTemplate
from tallow.errors import TallowError

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source,match", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe|failed"),
    ("{{ cycler.__init__.__globals__.os.system('echo pwned') }}", "unsafe|failed|undefined"),
    ("{{ messages.append(1) }}", "unsafe|failed"),
    ("{{ 'x' * 10000000000 }}", "limit is"),
    ("{{ 10 ** 100000000 }}", "limit is"),
    ("{% set s = 'x' * 1000000 %}{{ s + s }}", "limit is"),
    ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "limit of"),
])
def test_hostile_template_is_refused_in_one_sentence(source, match):
    t = ChatTemplate(source)
    with pytest.raises(TallowError, match=match) as e:
        t.render(MSG)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_endless_loop_is_stopped_by_the_time_limit(monkeypatch):
    monkeypatch.setenv("TALLOW_TEMPLATE_TIMEOUT", "0.5")
    source = "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    t = ChatTemplate(source)  # the load-time probes are bounded too
    with pytest.raises(TallowError, match="ran longer than 0.5 s"):
        t.render(MSG)
    assert time.monotonic() - t0 < 5


def test_ordinary_templates_render_unchanged():
    from tallow.chat.template import CHATML_TEMPLATE

    t = ChatTemplate(CHATML_TEMPLATE)
    for _ in range(50):  # the timer is always cancelled: no stray exception lands later
        assert t.render(MSG) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    time.sleep(0.1)
