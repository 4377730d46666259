"""What an answer may look like before a scorer that parses it with sympy sees it: data, never code.

Some reasoning-gym scorers evaluate the answer text: sympy's ``parse_expr`` (``countdown``, ``puzzle24``,
polynomials, integrals) runs it through ``eval``. The score is computed in the sandbox, but that alone is not
enough: code in the answer would run in the process that reports the score, and could write the score itself.
So the env's process checks such an answer first, and one that fails is scored 0 without being evaluated. A
plain ``expression`` holds numbers, ``+ - * / ** ^ ( ) , = !`` and names that are single letters or common
math functions (``sqrt``, ``log``, ``sin``, ``pi``, ``Integral``...): no string, attribute, subscript or other
name, so nothing in it can reach a file, the report pipe or sympy's own string parsing. (Scorers that call
``eval`` itself get an ``eval`` that reads literals only, in the scorer's process.)
"""

from __future__ import annotations

import io
import tokenize

__all__ = ["MATH_NAMES", "refusal"]
MATH_NAMES = frozenset({
    "sqrt", "exp", "log", "ln", "sin", "cos", "tan", "sec", "csc", "cot", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "pi", "oo", "Abs", "abs", "factorial", "Integral",
})
_OPERATORS = frozenset({"+", "-", "*", "/", "**", "^", "(", ")", ",", "=", "!"})
_SKIPPED = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER})
_MAX_CHARS = 10_000


def refusal(answer: str) -> str | None:
    """Why ``answer`` may not reach a scorer that parses it with sympy, or None if it may."""
    if len(answer) > _MAX_CHARS:
        return f"the answer has {len(answer):,} characters; a scored answer has at most {_MAX_CHARS:,}"
    problem = _not_an_expression(answer)
    return f"the answer is not a plain math expression ({problem})" if problem else None


def _not_an_expression(answer: str) -> str | None:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(answer).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as error:
        return f"it does not tokenize: {error}"
    for token in tokens:
        if token.type in _SKIPPED or token.type == tokenize.NUMBER:
            continue
        if token.type == tokenize.NAME and (len(token.string) == 1 and token.string.isascii()
                                            or token.string in MATH_NAMES):
            continue
        if token.type in (tokenize.OP, tokenize.ERRORTOKEN) and token.string in _OPERATORS:
            continue
        if token.type == tokenize.ERRORTOKEN and token.string.isspace():
            continue
        return f"{token.string!r} is not allowed"
    return None
