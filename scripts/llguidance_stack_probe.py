"""Where llguidance overflows its stack (ledger: docs/performance.md, "Hostile input").

    python scripts/llguidance_stack_probe.py chain|paren|refs N STACK_MIB   (STACK_MIB 0: the default 8 MiB)

Exit 139 is the SIGSEGV; grammar/limits.py sits well below what survives."""
import sys, threading
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark
kind, n, stack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def run():
    if kind == "chain":
        g = 'root ::= r0\n' + ''.join(f'r{i} ::= "a" r{i+1}\n' for i in range(n)) + f'r{n} ::= "b"\n'
        gr = LLMatcher.grammar_from_lark(any_to_lark(g))
    elif kind == "paren":
        gr = LLMatcher.grammar_from_lark('start: ' + "("*n + '"a"' + ")"*n)
    elif kind == "refs":
        defs = {f"d{i}": {"$ref": f"#/$defs/d{i+1}"} for i in range(n)}
        defs[f"d{n}"] = {"type": "string"}
        gr = LLMatcher.grammar_from_json_schema({"$ref": "#/$defs/d0", "$defs": defs})
    e = LLMatcher.validate_grammar(gr)
    print("validate", e[:100], flush=True)
if stack: threading.stack_size(stack << 20)
t = threading.Thread(target=run); t.start(); t.join()
print("ok")
