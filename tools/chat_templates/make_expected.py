#!/usr/bin/env python3
"""Renders every chat template fixture over a set of conversations exactly as transformers' apply_chat_template
does, and writes what Python's jinja2 produced (or the exception it raised) to tests/data/chat_templates/expected/,
one JSON file per template. tests/test_chat_template.cpp renders the same variables with cider's ChatTemplate and
compares byte for byte.

The environment is transformers' (transformers/utils/chat_template_utils.py, _compile_jinja_template):
  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
  filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  globals["raise_exception"] raises TemplateError(message); globals["strftime_now"] = datetime.now().strftime
and the variables are what apply_chat_template passes: messages, tools (None when there are none), documents (None),
add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...) and any extra keyword arguments.

Usage:  python3 tools/chat_templates/make_expected.py           # regenerate the expected files
        python3 tools/chat_templates/make_expected.py --check   # exit 1 if a checked-in file is out of date
Needs jinja2 (pip install jinja2; the fixtures were made with jinja2 3.1.6).
"""
import argparse
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")


class AssistantTracker(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Conversations.

SYSTEM = "You are a concise assistant."
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Suche im Web – nach „Stichworten“.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5},
                                      "score": {"type": "number", "minimum": 0.5}},
                       "required": ["query"]}}},
]


# The same tools with every parameter described (Command-R's tool_use template prints each description).
TOOLS_DESCRIBED = copy.deepcopy(TOOLS)
for _tool in TOOLS_DESCRIBED:
    for _name, _spec in _tool["function"]["parameters"]["properties"].items():
        _spec.setdefault("description", f"The {_name}.")


def tool_call(args_as_string):
    args = {"city": "Paris", "unit": "celsius"}
    return {"id": "call0A1b2", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(args) if args_as_string else args}}


def basic_cases():
    return [
        ("user_only", [{"role": "user", "content": "Hello!"}], {}, True),
        ("system_user", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}], {}, True),
        ("multi_turn", [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Hi there"},
                        {"role": "assistant", "content": "Hello! How can I help?"},
                        {"role": "user", "content": "Tell me a joke."}], {}, True),
        ("multi_turn_no_system", [{"role": "user", "content": "Hi there"},
                                  {"role": "assistant", "content": "Hello! How can I help?"},
                                  {"role": "user", "content": "Tell me a joke."}], {}, True),
        ("no_generation_prompt", [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello."}], {}, False),
        ("whitespace_content", [{"role": "system", "content": "  Be brief.\n"},
                                {"role": "user", "content": "\n  Spaces around  \n\n"},
                                {"role": "assistant", "content": " ok \t"},
                                {"role": "user", "content": "again "}], {}, True),
        ("non_ascii", [{"role": "system", "content": "Réponds en français 🇫🇷."},
                       {"role": "user", "content": "Grüße, 世界! 👋 — ça va? \"quotes\" and \\backslash\\"},
                       {"role": "assistant", "content": "Ça va très bien ✨"},
                       {"role": "user", "content": "Ünïcödé ΣΑΣ ß"}], {}, True),
        ("roles_not_alternating", [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], {}, True),
        ("assistant_first", [{"role": "assistant", "content": "I start."},
                             {"role": "user", "content": "Then me."}], {}, True),
        ("tools_absent_key", [{"role": "user", "content": "No tools key at all."}], {"__drop_tools__": True}, True),
    ]


def tool_cases(args_as_string=False, tools=TOOLS):
    call = tool_call(args_as_string)
    return [
        ("tools_user", [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "What's the weather in Paris?"}], {"tools": tools}, True),
        ("tools_no_system", [{"role": "user", "content": "What's the weather in Paris?"}], {"tools": tools}, True),
        ("tool_call_round_trip", [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": "What's the weather in Paris?"},
                                  {"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": "call0A1b2", "name": "get_weather",
                                   "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
                                  {"role": "assistant", "content": "It is 21 °C and clear."},
                                  {"role": "user", "content": "Thanks!"}], {"tools": tools}, True),
        ("tool_call_pending", [{"role": "user", "content": "What's the weather in Paris?"},
                               {"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call0A1b2", "name": "get_weather",
                                "content": "{\"temperature\": 21}"}], {"tools": tools}, True),
        ("tool_call_content_none", [{"role": "user", "content": "Weather?"},
                                    {"role": "assistant", "content": None, "tool_calls": [call]},
                                    {"role": "tool", "tool_call_id": "call0A1b2", "content": "sunny"}],
         {"tools": tools}, True),
    ]


def thinking_cases():
    return [
        ("thinking_history", [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "<think>\nEasy: 4.\n</think>\n\nIt is 4."},
                              {"role": "user", "content": "And 3+3?"}], {}, True),
        ("thinking_last_assistant", [{"role": "user", "content": "2+2?"},
                                     {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}], {}, False),
        ("reasoning_content", [{"role": "user", "content": "2+2?"},
                               {"role": "assistant", "content": "4", "reasoning_content": "simple addition"},
                               {"role": "user", "content": "sure?"}], {}, True),
        ("enable_thinking_false", [{"role": "user", "content": "Quick answer please."}],
         {"enable_thinking": False}, True),
        ("enable_thinking_true", [{"role": "user", "content": "Think it through."}], {"enable_thinking": True}, True),
    ]


LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
GEMMA_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
MISTRAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
DEEPSEEK_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}

# Model templates: which conversations apply and which special tokens the tokenizer passes.
MODELS = {
    "llama3-instruct.jinja": (LLAMA_TOKENS, basic_cases()),
    "llama3.1-instruct.jinja": (LLAMA_TOKENS, basic_cases() + tool_cases()
                                + [("builtin_tools", [{"role": "user", "content": "Search the news."}],
                                    {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}, True),
                                   ("tools_in_system", [{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": "Weather?"}],
                                    {"tools": TOOLS, "tools_in_user_message": False}, True),
                                   ("custom_date", [{"role": "user", "content": "Date?"}],
                                    {"date_string": "1 Jan 2025"}, True)]),
    "llama3.2-instruct.jinja": (LLAMA_TOKENS, [(n, m, dict(k, date_string="26 Jul 2024"), g)
                                               for (n, m, k, g) in basic_cases() + tool_cases()]),
    "qwen2.5-instruct.jinja": (QWEN_TOKENS, basic_cases() + tool_cases()),
    "qwen3.jinja": (QWEN_TOKENS, basic_cases() + tool_cases() + thinking_cases()
                    + [("tool_call_string_args", [{"role": "user", "content": "Weather?"},
                                                  {"role": "assistant", "content": "Let me check.",
                                                   "tool_calls": [tool_call(True)]},
                                                  {"role": "tool", "content": "<tool_response>sunny</tool_response>"},
                                                  {"role": "tool", "content": "second result"}],
                        {"tools": TOOLS}, True)]),
    "gemma2-it.jinja": (GEMMA_TOKENS, basic_cases()),
    "gemma3-it.jinja": (GEMMA_TOKENS, basic_cases()
                        + [("multimodal_content", [{"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
                                                   {"role": "user", "content": [{"type": "image"},
                                                                                {"type": "text", "text": " Describe. "}]}],
                            {}, True),
                           ("invalid_content", [{"role": "user", "content": 42}], {}, True)]),
    "mistral-7b-instruct-v0.3.jinja": (MISTRAL_TOKENS, basic_cases() + tool_cases()),
    "mistral-nemo-instruct-2407.jinja": (MISTRAL_TOKENS, basic_cases() + tool_cases()),
    "deepseek-r1-distill-qwen.jinja": (DEEPSEEK_TOKENS, basic_cases() + tool_cases(args_as_string=True)
                                       + thinking_cases()[:2]),
    "phi3.5-mini-instruct.jinja": ({"bos_token": "<s>", "eos_token": "<|endoftext|>"}, basic_cases()),
    "smollm2-instruct.jinja": ({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, basic_cases()),
    "hermes3-llama3.1-tool_use.jinja": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
                                        basic_cases() + tool_cases()),
    "functionary-medium-v3.1.jinja": (LLAMA_TOKENS, basic_cases() + tool_cases()),
    "command-r-plus-tool_use.jinja": ({"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
                                      basic_cases()[:2] + tool_cases(tools=TOOLS_DESCRIBED)),
    "smollm3.jinja": ({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"},
                      basic_cases() + tool_cases() + thinking_cases()
                      + [("xml_tools", [{"role": "user", "content": "Weather?"}], {"xml_tools": TOOLS}, True),
                         ("no_think_system", [{"role": "system", "content": "Be brief. /no_think"},
                                              {"role": "user", "content": "Hi"}], {}, True)]),
}


# Hand-written templates, each exercising a group of constructs; their cases set `mode` and other variables.
def constructs():
    people = [{"name": "Ada", "age": 36, "role": "user", "tags": ["math", "engines"]},
              {"name": "bob", "age": 25, "role": "assistant", "tags": []},
              {"name": "Éve", "age": 41, "role": "user", "tags": ["crypto"], "nick": "E"},
              {"name": "carl", "age": 25, "role": "system", "tags": ["x", "y", "z"]}]
    data = {"b": 2, "a": 1, "C": 3, "nested": {"k": [1, 2.5, None, True, "s"]}}
    one = lambda **kw: [("default", [], kw, True)]  # noqa: E731
    modes = lambda names, **kw: [(m, [], dict(kw, mode=m), True) for m in names]  # noqa: E731
    return {
        "t_whitespace.jinja": one(items=["a", "b", "c"], flag=True),
        "t_whitespace_crlf.jinja": one(items=["x", "y"]),
        "t_loops.jinja": one(people=people, data=data, words=["alpha", "beta", "gamma", "delta"], empty=[]),
        "t_scoping.jinja": one(people=people),
        "t_macros.jinja": one(schema={"type": "object", "properties": {
            "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
            "pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}}}),
        "t_filters_str.jinja": one(text="  Hello, wonderful World!  \n", multi="line one\nline two\n\nline four",
                                   html="<b>\"x\" & 'y'</b>", uni="ÀÉÎõü straße ΣΑΣ Привет"),
        "t_filters_seq.jinja": one(people=people, data=data, nums=[3, 1, 2, 3, 10, -4],
                                   words=["b", "A", "c", "a", "B"]),
        "t_tojson.jinja": one(data=data, people=people, text="quote \" backslash \\ newline \n tab \t ctrl \u0001 é 😀",
                              floats=[0.1, 1.0, 1e16, 1e-5, 123456789.125, -0.0, 2.5e-320, 1.7976931348623157e308],
                              ints=[0, -1, 9007199254740993, -9223372036854775808]),
        "t_expressions.jinja": one(x=7, y=2, f=2.5, s="héllo wörld", xs=[1, 2, 3, 4, 5], d={"k": "v"}, t=True,
                                   n=None),
        "t_tests.jinja": one(values=[None, True, False, 0, 1, 2, -3, 2.0, 0.5, "", "abc", "ABC", "aBc", [], [1],
                                     {}, {"a": 1}], d={"a": 1}),
        "t_methods.jinja": one(s="  a,b,,c  ", path="/usr/local/lib/", csv="x=1;y=2;z=3", d={"a": 1, "b": None},
                               xs=[1, 2, 2, 3], title="hello wORLD of 3d-printing"),
        "t_undefined.jinja": one(d={"a": 1}, xs=[1, 2]),
        "t_markup.jinja": one(name="<fn>", desc="a & b", params={"q": "<'\"&>"}),
        "t_generation.jinja": [("default", [{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello"}], {}, True)],
        "t_errors.jinja": modes(["raise", "undefined_attr", "undefined_call", "undefined_name_attr", "concat_none",
                                 "add_int_str", "list_append", "dict_update", "zero_div", "int_floordiv_zero",
                                 "not_iterable", "unknown_filter_in_if", "unknown_test_in_if", "none_attr_attr",
                                 "index_error_attr", "compare_types", "namespace_set", "unpack", "range_too_big",
                                 "str_in_int", "ok"], d={"a": 1}, xs=[1, 2]),
    }


# ---------------------------------------------------------------------------------------------------------------------

def render_case(env, source, messages, kwargs, add_generation_prompt, tokens):
    variables = {"messages": copy.deepcopy(messages), "tools": None, "documents": None,
                 "add_generation_prompt": add_generation_prompt}
    variables.update(tokens)
    extra = copy.deepcopy(kwargs)
    drop_tools = extra.pop("__drop_tools__", False)
    variables.update(extra)
    if drop_tools:
        del variables["tools"]
        del variables["documents"]
    case = {"variables": variables}
    try:
        template = env.from_string(source)
        case["expected"] = template.render(**copy.deepcopy(variables))
    except Exception as e:  # noqa: BLE001 - every exception jinja2 or the template raises is an expected result
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    return case


def build():
    env = make_environment()
    outputs = {}
    table = {name: spec for name, spec in MODELS.items()}
    for name, cases in constructs().items():
        table[name] = ({}, cases)
    for name, (tokens, cases) in sorted(table.items()):
        with open(os.path.join(DATA, "templates", name), encoding="utf-8", newline="") as f:
            source = f.read()
        out = []
        for case_name, messages, kwargs, gen in cases:
            case = {"name": case_name}
            case.update(render_case(env, source, messages, kwargs, gen, tokens))
            out.append(case)
        stem = name[: -len(".jinja")]
        outputs[os.path.join(DATA, "expected", stem + ".json")] = (
            json.dumps({"template": name, "jinja2_version": jinja2.__version__, "cases": out},
                       ensure_ascii=False, indent=1) + "\n")
    return outputs


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the checked-in files instead of writing")
    args = parser.parse_args()
    outputs = build()
    stale = []
    for path, text in sorted(outputs.items()):
        old = None
        if os.path.exists(path):
            with open(path, encoding="utf-8", newline="") as f:
                old = f.read()
        if old == text:
            continue
        stale.append(path)
        if not args.check:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
    for path in stale:
        print(("out of date: " if args.check else "wrote: ") + os.path.relpath(path, ROOT))
    if args.check and stale:
        return 1
    print(f"{len(outputs)} templates, {len(stale)} {'stale' if args.check else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
