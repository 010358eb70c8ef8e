"""Small templates exercising each feature of the Jinja subset (used by
make_chat_template_fixtures.py). Each entry: (name, template, context). Expected output comes
from jinja2, never from our own interpreter."""

M = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi there"},
                  {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]}

CASES = [
    # whitespace control, trim_blocks / lstrip_blocks
    ("ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB", {}),
    ("ws_lstrip_blocks", "x\n    {% if true %}\n    y\n    {% endif %}\nz", {}),
    ("ws_minus_both", "a   {{- 'b' -}}   c", {}),
    ("ws_minus_block", "a\n\n  {%- if true -%}\n\n  b  \n{%- endif %}\nc", {}),
    ("ws_plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", {}),
    ("ws_plus_disables_trim", "{% if true +%}\ny{% endif %}", {}),
    ("ws_comment_trim", "a\n  {# note #}\nb {#- x -#}  c", {}),
    ("ws_variable_no_trim", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("ws_trailing_newline_dropped", "line\n", {}),
    ("ws_crlf_normalised", "a\r\nb\rc", {}),
    ("ws_raw_block", "{% raw %}{{ not evaluated }}{% endraw %}!", {}),
    ("ws_inline_after_output", "{{ 'a' }}   {% if true %}b{% endif %}", {}),
    # literals and printing
    ("print_types", "{{ none }}|{{ true }}|{{ False }}|{{ 1 }}|{{ 1.0 }}|{{ 2.5e10 }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1e-5 }}|{{ -0.0 }}", {}),
    ("print_list_dict", "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }}", {}),
    ("print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'é'] }}", {}),
    ("print_undefined_empty", "[{{ missing }}][{{ missing is defined }}][{{ d.missing }}]", {"d": {}}),
    ("print_tuples", "{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ [(1, 2)] }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\x41\\u00e9\\U0001F600\\101\\q' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("integer_underscores", "{{ 1_000 + 0 }}", {}),
    # arithmetic and operators
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("arith_bool_int", "{{ true + 1 }} {{ 3 * true }} {{ 1 == 1.0 }} {{ true == 1 }}", {}),
    ("concat_tilde", "{{ 1 ~ 'a' ~ none ~ true ~ [1] }}", {}),
    ("string_repeat", "{{ 'ab' * 3 }}{{ [1] * 2 }}", {}),
    ("list_concat", "{{ [1] + [2, 3] }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 ~ (2 + 3) }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }}", {}),
    ("concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 }}", {}),
    ("compare_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }}", {}),
    ("not_precedence", "{{ not 1 == 2 }} {{ not true and false }}", {}),
    ("conditional_expr", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]", {}),
    ("str_plus_int_error", "{{ 'a' + 1 }}", {}),
    ("undefined_plus_error", "{{ missing + 'a' }}", {}),
    ("division_by_zero", "{{ 1 // 0 }}", {}),
    # subscripts and slices
    ("index_negative", "{{ messages[-1].content }} {{ messages[0]['role'] }} {{ messages.0.role }}", M),
    ("index_out_of_range", "[{{ messages[10] }}]", M),
    ("slices", "{{ [1,2,3,4,5][1:3] }} {{ [1,2,3,4,5][::-1] }} {{ [1,2,3,4,5][::2] }} {{ 'héllo'[1:] }} {{ 'abc'[-2:] }} {{ [1,2,3][5:] }} {{ [1,2,3][-10:2] }} {{ 'abcdef'[4:1:-1] }}", {}),
    ("string_index", "{{ 'héllo'[1] }}{{ 'abc'[-1] }}", {}),
    ("attr_of_undefined_error", "{{ missing.attr }}", {}),
    ("item_of_none_is_undefined", "[{{ none.x }}]", {}),
    ("dict_method_vs_key", "{{ d.items() | list }} {{ d['get'] is defined }} {{ d.get('a') }} {{ d.get('zz', 5) }} {{ d.keys() | list }} {{ d.values() | list }}", {"d": {"a": 1, "b": 2}}),
    # statements
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% endfor %}", M),
    ("for_dict_and_unpack", "{% for k in d %}{{ k }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("for_cycle", "{% for i in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("scoping_loop_does_not_leak", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("scoping_if_leaks", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("namespace_across_loop", "{% set ns = namespace(total=0, names=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% set ns.names = ns.names + [i] %}{% endfor %}{{ ns.total }} {{ ns.names }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("set_block", "{% set block %}Hi {{ 'there' }}{% endset %}[{{ block }}]", {}),
    ("set_block_filter", "{% set block | upper %}abc{% endset %}{{ block }}", {}),
    ("if_elif_else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("macro_basic", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C') }} [{{ greet() }}]", {}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ bos_token }}{% endmacro %}{{ m() }}", {"bos_token": "<s>"}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("call_block", "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
    ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    # filters
    ("f_trim_length", "[{{ '  a b  ' | trim }}][{{ 'xxaxx' | trim('x') }}] {{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }}", {}),
    ("f_case", "{{ 'Hello World' | upper }} {{ 'Hello World' | lower }} {{ 'hello wORLD' | capitalize }} {{ 'hello big-world (x)' | title }}", {}),
    ("f_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é\"\\n' | tojson }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ 1.5 | tojson }}|{{ none | tojson }}", {"d": {"z": 1, "a": [1, 2.0, "ü"], "n": None, "t": True, "o": {}}}),
    ("f_tojson_indent_nested", "{{ d | tojson(indent=4) }}", {"d": {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "string"}}, "required": ["x"]}}}}),
    ("f_tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", {"d": {"a": [1, 2], "b": "c"}}),
    ("f_tojson_undefined_error", "{{ missing | tojson }}", {}),
    ("f_string_join", "{{ [1, 'a', none] | join(', ') }} {{ [1, 2] | string }} {{ messages | map(attribute='role') | join('|') }}", M),
    ("f_join_attribute", "{{ messages | join(',', attribute='content') }}", M),
    ("f_default", "{{ missing | default('dflt') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | d('n') }} {{ 0 | default(1, boolean=true) }}", {}),
    ("f_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ 'abc' | last }} [{{ [] | first }}]", {}),
    ("f_items", "{% for k, v in d | items %}{{ k }}:{{ v }};{% endfor %}{% for k, v in missing | items %}x{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("f_items_error", "{{ [1] | items | list }}", {}),
    ("f_selectattr", "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('role', 'equalto', 'user') | list | length }}", M),
    ("f_selectattr_truthy", "{{ xs | selectattr('on') | map(attribute='n') | list }}", {"xs": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3}]}),
    ("f_select_reject", "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'b', 'code'] | reject('equalto', 'code') | list }} {{ [1, 5, 9] | select('gt', 4) | list }}", {}),
    ("f_map_filter", "{{ ['a', 'b'] | map('upper') | list }} {{ xs | map(attribute='n', default=0) | list }}", {"xs": [{"n": 1}, {}]}),
    ("f_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}", {}),
    ("f_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(first=true, blank=true) }}|{{ 'x\\ny' | indent('> ') }}", {}),
    ("f_sort_unique_reverse", "{{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ xs | sort(attribute='n') | map(attribute='n') | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}", {"xs": [{"n": 2}, {"n": 1}]}),
    ("f_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }} {{ [1, 2.5] | sum }}", {}),
    ("f_round_ints", "{{ 5 | round }} {{ 15 | round(-1) }} {{ 25 | round(-1) }} {{ -35 | round(-1) }} {{ 7 | round(1, 'floor') }} {{ 7 | round(method='ceil') }} {{ true | round }}", {}),
    ("f_list_dictsort", "{{ 'ab' | list }} {{ {'b': 1, 'a': 2} | dictsort }}", {}),
    ("f_escape_safe", "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | safe }}", {}),
    # markupsafe's Markup (|safe, |escape): a plain str concatenated to it is escaped, its methods
    # return Markup, `~` gives plain text (functionary-medium-v3.1 builds its tool list this way)
    ("markup_concat", "{{ 'a<'|safe + '<b>' + 'c' }}|{{ 'x&' + '<'|safe }}|{{ ('x'|safe + '<') ~ '<' }}|{{ '<'|e + '&' }}|{{ '<'|e|e }}|{{ '<'|safe is escaped }}|{{ '<' is escaped }}|{{ none|e }}", {}),
    ("markup_methods", "{{ ('a'|safe + '<').upper() }}|{{ ('a'|safe).replace('a', '<') }}|{{ ('<b>'|safe)[0:2] + '<' }}|{{ ('a<'|safe).split('<') }}|{{ ('a'|safe + '<')|upper }}|{{ ('a'|safe + '<')|title }}|{{ (', '|safe).join(['<', '>']) }}|{{ (' x'|safe + '<')|trim }}|{{ ['a'|safe] }}|{{ ('a'|safe)[0] + '<' }}|{{ ('ab'|safe)|reverse + '<' }}|{{ ('a'|safe)|string + '<' }}|{{ ('a'|safe).startswith('a') }}", {}),
    ("markup_functionary_tools", "{{ 'Use the function '|safe + t['name'] + ' to '|safe + t['description'] + '\n'|safe + t | tojson }}", {"t": {"name": "f<x>", "description": "it's \"quoted\" & more"}}),
    ("markup_add_int_error", "{{ 'a'|safe + 1 }}", {}),
    # tests
    ("tests_types", "{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is integer }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ none is none }}{{ missing is undefined }}{{ range is callable }}", {}),
    ("tests_values", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 2 is gt 1 }}{{ 1 is lt 2 }}{{ 2 is ge 2 }}{{ 'b' is in 'abc' }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ false is false }}{{ 0 is false }}{{ true is true }}{{ none is sameas none }}{{ 2 is ne 3 }}", {}),
    ("tests_not", "{{ x is not none }}{{ x is not defined }}{{ not x is defined }}", {"x": None}),
    # methods
    ("m_string", "{{ ' a b '.strip() }}|{{ 'xxay'.lstrip('x') }}|{{ 'ayxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'abcb'.find('b') }}|{{ 'abcb'.count('b') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}|{{ '12'.isdigit() }}", {}),
    ("m_split_think", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
    ("m_unicode_strip", "[{{ '\\u3000 x \\xa0'.strip() }}][{{ '\\u3000 x \\xa0' | trim }}]", {}),
    # globals
    ("g_range", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}", {}),
    ("g_dict", "{{ dict(a=1, b='x') }}", {}),
    ("g_strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d') }}", {}),
    ("g_raise", "{{ raise_exception('custom failure: ' ~ 42) }}", {}),
    ("g_raise_in_loop", "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no assistants') }}{% endif %}{{ m.content }}{% endfor %}", M),
    ("call_non_callable", "{{ 'abc'() }}", {}),
    ("call_undefined", "{{ nothing() }}", {}),
    ("unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("range_too_big", "{{ range(1000000) | length }}", {}),
    # syntax errors (load-time)
    ("syntax_unclosed_if", "{% if true %}x", {}),
    ("syntax_unclosed_var", "{{ x", {}),
    ("syntax_bad_expr", "{{ 1 + }}", {}),
    ("syntax_unknown_tag", "{% frobnicate %}", {}),
    ("syntax_unknown_filter", "{{ x | frobnicate }}", {}),
    ("syntax_unknown_test", "{{ x is frobnicate }}", {}),
    ("syntax_endfor_mismatch", "{% for x in y %}{% endif %}", {}),
    ("syntax_unclosed_comment", "{# abc", {}),
    ("syntax_unclosed_string", "{{ 'abc }}", {}),
    ("syntax_break_outside_loop", "{% break %}", {}),
    ("syntax_stray_paren", "{{ (1 }}", {}),
]


# Random templates: whitespace-control tags, comments, raw blocks and expressions mixed with
# spaces, tabs and newlines — the lexer rules where a byte of difference is easy to miss.
RANDOM_WS = ['', ' ', '  ', '\n', ' \n', '\n  ', '\t', '\n\n', 'x', 'x\n', '\n x ']
RANDOM_TAGS = ['{% if a %}', '{% endif %}', '{%- if a %}', '{% if a -%}', '{%+ if a %}', '{% if a +%}',
               '{{ a }}', '{{- a }}', '{{ a -}}', '{# c #}', '{#- c -#}', '{% for i in b %}', '{% endfor %}',
               '{% set z = 1 %}', '{%- set z = 2 -%}', '{{ z }}', '{% raw %}r{% endraw %}', '{% else %}',
               '{%- elif a > 1 %}', '{% break %}']
RANDOM_EXPRS = [
    'a', 'b', 'a + 1', 'b|length', "s.strip()", "s|trim", "s.split()", "s[1:3]", "s[::-1]", "b[-1]", "a ~ s",
    "a / 3", "a // 3", "-a % 3", "a ** 2", "s * 2", "b + [4]", "d|tojson", "d|tojson(indent=2)",
    "d.items()|list", "d|dictsort", "s.title()", "s.upper()", "s|title", "s|capitalize", "s.lstrip('h')",
    "s.split('l')", "'l' in s", "b|join('-')", "b|sum", "b|max", "(b|min, a)", "b|select('odd')|list",
    "b|map('string')|join", "s|replace('l', 'L', 1)", "s|indent(2)", "a is odd", "a is divisibleby 2",
    "s is lower", "none is none", "d.get('k', 'dflt')", "d['n']", "d.n is none", "b[10] is defined",
    "1.5 * a", "a / 2", "10 / 4", "7.0 // 2", "1e300 * 1e300", "0.1 + 0.2", "1/3", "s|length", "s|list",
    "s[1]", "s|first", "b|last", "range(a)|list", "b|reverse|list", "b|unique|list", "[1, 'a']|string",
    "{'a': [1, (2, 3)]}", "(1,)", "a if a > 2 else b", "not a", "a and s", "a or s", "b == [1, 2, 3]",
    "b != [1, 2]", "s < 'z'", "d == {'k': 'v', 'n': none}", "true == 1", "1 == 1.0", "'a' ~ none",
    "loop.index if loop is defined else 0", "s.upper().split()", "u|upper", "u.title()", "u|lower",
    "u.capitalize()", "u|capitalize", "u is upper"]
RANDOM_CONTEXT = {'a': 3, 'b': [1, 2, 3], 's': ' héllo wörld ', 'd': {'k': 'v', 'n': None},
                  'u': 'ärger über ΣΊΣΥΦΟΣ straße ǆ'}


def random_cases(seed, count):
    import random
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(RANDOM_WS))
            elif r < 0.75:
                parts.append(rng.choice(RANDOM_TAGS))
            else:
                parts.append('{{ ' + rng.choice(RANDOM_EXPRS) + ' }}')
        cases.append((f"random_{seed}_{i}", ''.join(parts), RANDOM_CONTEXT))
    return cases


# Every filter on every falsy value (and on two truthy non-iterables): jinja2's select, reject,
# selectattr, rejectattr and map yield nothing for a falsy input, other filters iterate, call
# len() or convert it and raise; the C++ side must do exactly what jinja2 does, error message
# included. Generator results are piped through `list` (a generator object prints its address).
FALSY_INPUTS = [("none", "none"), ("false", "false"), ("zero", "0"), ("zero_float", "0.0"), ("empty_str", "''"),
                ("empty_list", "[]"), ("empty_dict", "{}"), ("undefined", "missing"), ("true", "true"), ("five", "5")]
FALSY_FILTERS = [
    ("select", "select | list"), ("select_test", "select('none') | list"), ("reject", "reject | list"),
    ("reject_test", "reject('defined') | list"), ("selectattr", "selectattr('a') | list"),
    ("selectattr_test", "selectattr('a', 'equalto', 1) | list"), ("rejectattr", "rejectattr('a') | list"),
    ("rejectattr_test", "rejectattr('a', 'none') | list"), ("map_filter", "map('upper') | list"),
    ("map_attribute", "map(attribute='a') | list"), ("map_attribute_default", "map(attribute='a', default=1) | list"),
    ("unique", "unique | list"), ("reverse", "reverse | list"), ("items", "items | list"), ("list", "list"),
    ("sort", "sort"), ("dictsort", "dictsort"), ("join", "join(', ')"), ("join_attribute", "join(',', attribute='a')"),
    ("first", "first"), ("last", "last"), ("length", "length"), ("count", "count"), ("sum", "sum"), ("max", "max"),
    ("min", "min"), ("int", "int"), ("float", "float"), ("abs", "abs"), ("round", "round"), ("string", "string"),
    ("upper", "upper"), ("lower", "lower"), ("title", "title"), ("capitalize", "capitalize"), ("trim", "trim"),
    ("escape", "e"), ("safe", "safe"), ("tojson", "tojson"), ("default", "default('d')"),
    ("default_boolean", "default('d', true)"), ("indent", "indent(2)"), ("replace", "replace('o', '0')"),
    ("attr", "attr('a')"),
]


def falsy_cases():
    cases = []
    for input_name, expr in FALSY_INPUTS:
        for filter_name, chain in FALSY_FILTERS:
            cases.append((f"falsy_{filter_name}_{input_name}", "{{ " + expr + " | " + chain + " }}", {}))
    # The template that showed it: functionary-medium-v3.1 does `tools | selectattr(...)` with
    # tools none, and for-loops over filtered falsy values must simply run zero times.
    cases.append(("falsy_functionary_pattern",
                  "{% for t in tools | selectattr('type', 'equalto', 'function') %}x{% endfor %}[{{ tools | "
                  "selectattr('type') | list | length }}]", {"tools": None}))
    cases.append(("falsy_loop_over_map", "{% for n in messages | map(attribute='name') %}{{ n }}{% endfor %}.",
                  {"messages": []}))
    return cases
