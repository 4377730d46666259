"""What an answer may look like before a scorer that parses it with sympy sees it: data, never code.

Some reasoning-gym scorers evaluate the answer text: sympy's ``parse_expr`` (``countdown``, ``puzzle24``,
polynomials, integrals) runs it through ``eval``. The score is computed in the sandbox, but that alone is not
enough: code in the answer would run in the process that reports the score, and could write the score itself.
So the env's process checks such an answer first, and one that fails is scored 0 without being evaluated. A
plain ``expression`` holds numbers, ``+ - * / ** ^ ( ) , = !`` and names that are single letters or common
math functions (``sqrt``, ``log``, ``sin``, ``pi``, ``Integral``...): no string, attribute, subscript or other
name, so nothing in it can reach a file, the report pipe or sympy's own string parsing. (Scorers that call
``eval`` itself get an ``eval`` that reads literals and bounded arithmetic only, in the scorer's process.)

A plain expression can still cost the scorer its whole CPU limit: sympy computes ``9**9**9**9`` or
``factorial(10**9)`` exactly. So the gate also bounds the size of every number the expression computes, before
anything computes it: the powers and factorials of numbers (and ``N``'s precision) whose result would pass
``MAX_RESULT_BITS`` are refused; sums and products of the numbers written cannot grow past what the answer's
length allows. Powers of symbols (``x**1000``) stay symbolic in sympy and pass.
"""

from __future__ import annotations

import io
import math
import tokenize
from fractions import Fraction

__all__ = ["MATH_NAMES", "MAX_RESULT_BITS", "refusal"]
MATH_NAMES = frozenset({
    "sqrt", "exp", "log", "ln", "sin", "cos", "tan", "sec", "csc", "cot", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "pi", "oo", "Abs", "abs", "factorial", "Integral",
})
_OPERATORS = frozenset({"+", "-", "*", "/", "**", "^", "(", ")", ",", "=", "!"})
_SKIPPED = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER})
_MAX_CHARS = 10_000
MAX_RESULT_BITS = 100_000  # ~30,000 digits: sympy computes such a power in milliseconds, 9**9**9 in minutes
_EXACT_BITS = 4_096  # numbers the gate itself keeps exact; larger ones only by their size (cheap to check)
_MAX_PRECISION = 10_000  # digits N(x, digits) may ask of sympy


def refusal(answer: str) -> str | None:
    """Why ``answer`` may not reach a scorer that parses it with sympy, or None if it may."""
    if len(answer) > _MAX_CHARS:
        return f"the answer has {len(answer):,} characters; a scored answer has at most {_MAX_CHARS:,}"
    problem = _not_an_expression(answer)
    if problem:
        return f"the answer is not a plain math expression ({problem})"
    problem = _too_costly(answer)
    return f"the answer is too large to score ({problem})" if problem else None


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


class _Refused(Exception):
    """What makes an answer too costly to compute."""


class _Unreadable(Exception):
    """An answer the size check's parser does not read (sympy may still: the tokens decide then)."""


class _Size:
    """A number known only by an upper bound on its size in bits (too large, or irrational: ``sqrt(2)``)."""

    def __init__(self, bits: float) -> None:
        self.bits = bits


_SYMBOLIC = object()  # holds a symbol (x), a float (cheap in sympy) or something the gate cannot size
_CALLS_OF_ONE = frozenset({"factorial", "sqrt", "exp", "log", "ln", "Abs", "abs"})


def _too_costly(answer: str) -> str | None:
    """Why computing ``answer``'s numbers would take a scorer too long, or None. Reads the expression with a small
    parser (``^`` and ``**`` are powers, ``n!`` a factorial, ``2x`` a product) and sizes every number it makes."""
    skipped = _SKIPPED | {tokenize.COMMENT}
    tokens = [token.string for token in tokenize.generate_tokens(io.StringIO(answer).readline)
              if token.type not in skipped and not token.string.isspace()]
    parser = _Parser(tokens)
    try:
        parser.answer()
        if parser.position != len(tokens):
            raise _Unreadable(f"unexpected {parser.peek()!r}")
    except _Refused as refusal:
        return str(refusal)
    except (RecursionError, IndexError, ValueError, _Unreadable):
        if any(token in ("**", "^", "!", "factorial", "N") for token in tokens):
            return "its numbers could not be sized and it computes powers or factorials"
    return None


def _bits(value: object) -> float:
    if isinstance(value, _Size):
        return value.bits
    assert isinstance(value, Fraction)
    return max(abs(value.numerator), value.denominator).bit_length()


def _number(bits: float, exact: Fraction | None = None) -> object:
    """An exact value while small, else its size; refused past MAX_RESULT_BITS."""
    if bits > MAX_RESULT_BITS:
        raise _Refused(f"a number of about {bits:,.0f} bits; the limit is {MAX_RESULT_BITS:,}")
    return exact if exact is not None and bits <= _EXACT_BITS else _Size(bits)


class _Parser:
    """answer := expr ((',' | '=') expr)*; expr := term (('+' | '-') term)*; term := unary (('*' | '/')? unary)*;
    unary := ('+' | '-') unary | power; power := postfix (('**' | '^') unary)?; postfix := atom '!'*;
    atom := NUMBER | NAME ['(' answer ')'] | '(' answer ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.position]
        self.position += 1
        return token

    def answer(self) -> object:
        values = [self.expr()]
        while self.peek() in (",", "="):
            self.take()
            values.append(self.expr())
        if self.peek() is not None and self.peek() != ")":
            raise _Unreadable(f"unexpected {self.peek()!r}")
        return values[0] if len(values) == 1 else _SYMBOLIC

    def expr(self) -> object:
        value = self.term()
        while self.peek() in ("+", "-"):
            self.take()
            value = _arithmetic(value, self.term(), "+")
        return value

    def term(self) -> object:
        value = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "/"):
                self.take()
                value = _arithmetic(value, self.unary(), token)
            elif token is not None and (token == "(" or token[0].isalnum() or token[0] in "._"):
                value = _arithmetic(value, self.unary(), "*")  # 2x, 3(x + 1): sympy's implicit product
            else:
                return value

    def unary(self) -> object:
        if self.peek() in ("+", "-"):
            self.take()
            value = self.unary()
            return -value if isinstance(value, Fraction) else value
        return self.power()

    def power(self) -> object:
        base = self.postfix()
        if self.peek() in ("**", "^"):
            self.take()
            return _power(base, self.unary())
        return base

    def postfix(self) -> object:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            value = _factorial(value)
        return value

    def atom(self) -> object:
        token = self.take()
        if token == "(":
            value = self.answer()
            if self.take() != ")":
                raise _Unreadable("unbalanced parenthesis")
            return value
        if token[0].isdigit() or token[0] == ".":
            return _literal(token)
        if token[0].isalpha():
            if self.peek() != "(":
                return _Size(2) if token in ("pi", "E") else _SYMBOLIC
            self.take()
            arguments = [self.expr()] if self.peek() != ")" else []
            while self.peek() in (",", "="):
                self.take()
                arguments.append(self.expr())
            if self.take() != ")":
                raise _Unreadable("unbalanced parenthesis")
            return _call(token, arguments)
        raise _Unreadable(f"unexpected {token!r}")


def _literal(token: str) -> object:
    text = token.replace("_", "").lower()
    if text.endswith("j") or any(mark in text for mark in (".", "e")) and not text.startswith("0x"):
        return _SYMBOLIC  # a float or complex literal: sympy computes with floats, cheaply
    digits = len(text)
    if digits > 1_000:  # past int()'s digit limit, and past what the gate keeps exact
        return _number(digits * math.log2(10))
    value = int(text, 0)
    return _number(value.bit_length(), Fraction(value))


def _arithmetic(left: object, right: object, operator: str) -> object:
    if left is _SYMBOLIC or right is _SYMBOLIC:
        return _SYMBOLIC
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        if operator == "/" and right == 0:
            return _SYMBOLIC  # zoo: sympy's, not a cost
        exact = left + right if operator == "+" else left * right if operator == "*" else left / right
        return _number(_bits(exact), exact)
    return _number(_bits(left) + _bits(right) + 1)


def _power(base: object, exponent: object) -> object:
    if exponent is _SYMBOLIC:
        return _SYMBOLIC
    if isinstance(exponent, _Size):
        if isinstance(base, Fraction) and abs(base) in (0, 1):
            return base
        # an exponent known only by its size: at least 2 ** (bits - 1), so any other base makes a huge number
        raise _Refused(f"a power with an exponent of about {exponent.bits:,.0f} bits")
    if base is _SYMBOLIC:
        return _SYMBOLIC  # x ** 1000 stays symbolic
    magnitude = abs(exponent)
    if isinstance(base, Fraction):
        if base in (0, 1, -1):
            return base if exponent.denominator == 1 or base != -1 else _SYMBOLIC
        bits = float(magnitude) * math.log2(max(abs(base.numerator), base.denominator))
        exact = base ** int(exponent) if exponent.denominator == 1 and bits <= _EXACT_BITS else None
        return _number(bits, exact)
    return _number(float(magnitude) * max(base.bits, 1.0))


def _factorial(value: object) -> object:
    if value is _SYMBOLIC:
        return _SYMBOLIC
    if isinstance(value, _Size):
        if value.bits > 40:
            raise _Refused(f"the factorial of a number of about {value.bits:,.0f} bits")
        argument = 2.0 ** value.bits
    elif value.denominator != 1 or value < 0:
        return _SYMBOLIC  # sympy's gamma or zoo, not an exact integer
    else:
        argument = float(value)
    bits = math.lgamma(argument + 1) / math.log(2)
    exact = Fraction(math.factorial(int(value))) if isinstance(value, Fraction) and bits <= _EXACT_BITS else None
    return _number(bits, exact)


def _call(name: str, arguments: list[object]) -> object:
    if name == "N":  # sympy's numeric evaluation: its precision costs
        precision = arguments[1] if len(arguments) > 1 else Fraction(15)
        if not isinstance(precision, Fraction) or precision > _MAX_PRECISION:
            raise _Refused(f"N() asked for more than {_MAX_PRECISION:,} digits")
        return _SYMBOLIC
    if name == "factorial" and len(arguments) == 1:
        return _factorial(arguments[0])
    if name in _CALLS_OF_ONE and len(arguments) == 1 and arguments[0] is not _SYMBOLIC:
        return _Size(_bits(arguments[0]) + 2)  # a root, log, exp... of a sized number: no larger than it, or exp's
    return _SYMBOLIC
