"""The ``calculate`` tool: a safe arithmetic evaluator for agents.

:func:`safe_eval` walks the expression's ``ast`` itself (never ``eval``/``exec``), computes exactly with
integers and fractions where it can, and refuses anything that could take long or grow large *before*
computing it: long inputs, many nodes, huge exponents, results beyond ``max_abs``, and fractions whose
numerator or denominator would pass ``max_bits`` (a tiny fraction to a power grows its denominator without
bound, and Python's big-integer arithmetic holds the interpreter lock while it does, so no timeout could stop
it). Every operand and every result is within those bounds, so each operation is cheap.
"""

from __future__ import annotations

import ast
import decimal
import math
from fractions import Fraction

from agent_gym.error import AgentGymError
from agent_gym.tools.core import ToolResult, tool

__all__ = ["CalculatorError", "calculate", "format_number", "safe_eval"]

Number = int | float | Fraction

MAX_CHARS = 200
MAX_ABS = 1e15
MAX_NODES = 100
MAX_EXPONENT = 1_000
MAX_BITS = 1_024  # numerator and denominator of an exact fraction: ~308 digits each

# Models write these; map them to Python's operators before parsing.
_UNICODE_OPERATORS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}
_FUNCTION_ARITY: dict[str, tuple[int, int]] = {
    "abs": (1, 1),
    "round": (1, 2),
    "min": (2, 32),
    "max": (2, 32),
    "sqrt": (1, 1),
    "floor": (1, 1),
    "ceil": (1, 1),
}
_HELP = f"allowed: numbers, + - * / // % **, parentheses, {', '.join(_FUNCTION_ARITY)}, pi, e"


class CalculatorError(AgentGymError, ValueError):
    """The expression is invalid, unsafe or undefined; the message says why, for the agent to read."""


def safe_eval(
    expression: str,
    *,
    max_chars: int = MAX_CHARS,
    max_abs: float = MAX_ABS,
    max_nodes: int = MAX_NODES,
    max_exponent: int = MAX_EXPONENT,
    max_bits: int = MAX_BITS,
) -> Number:
    """Evaluate an arithmetic expression without ``eval``.

    Integers and fractions stay exact (``7 / 2`` is ``Fraction(7, 2)``, ``6 / 3`` is ``2``); a float anywhere
    (a literal, ``sqrt``, a fractional power) makes the result a float.

    Raises:
        CalculatorError: on syntax errors, unknown names, division by zero, and any input or intermediate
            result beyond the limits (an exact fraction's numerator or denominator beyond ``max_bits`` bits
            included).
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > max_chars:
        raise CalculatorError(f"expression is {len(expression)} characters long; the limit is {max_chars}")
    text = expression.translate(_UNICODE_OPERATORS).strip()
    if not text:
        raise CalculatorError(f"empty expression; {_HELP}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"syntax error in {text!r}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise CalculatorError(f"cannot parse expression: {type(exc).__name__}") from None
    for count, _ in enumerate(ast.walk(tree), start=1):
        if count > max_nodes:
            raise CalculatorError(f"expression has more than {max_nodes} parts; split it into smaller steps")
    try:
        return _Evaluator(max_abs, max_exponent, max_bits).evaluate(tree.body)
    except RecursionError:  # only reachable when the caller raises max_nodes far above the default
        raise CalculatorError("expression is nested too deeply") from None


class _Evaluator:
    def __init__(self, max_abs: float, max_exponent: int, max_bits: int) -> None:
        self.max_abs = max_abs
        self.max_exponent = max_exponent
        self.max_bits = max_bits

    def evaluate(self, node: ast.AST) -> Number:
        value = self._visit(node)
        if isinstance(value, Fraction) and value.denominator == 1:
            return int(value)
        return value

    def _visit(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            return self._check(self._constant(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            operand = self._visit(node.operand)
            return operand if isinstance(node.op, ast.UAdd) else -operand
        if isinstance(node, ast.BinOp):
            return self._check(self._binary(node.op, self._visit(node.left), self._visit(node.right)))
        if isinstance(node, ast.Call):
            return self._check(self._call(node))
        if isinstance(node, ast.Name):
            if node.id in _CONSTANTS:
                return _CONSTANTS[node.id]
            raise CalculatorError(f"unknown name {node.id!r}; {_HELP}")
        if isinstance(node, ast.Tuple):
            raise CalculatorError("commas are not allowed in numbers: write 4382, not 4,382")
        raise CalculatorError(f"unsupported syntax ({type(node).__name__}); {_HELP}")

    @staticmethod
    def _constant(value: object) -> Number:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {value!r}")
        return value

    def _check(self, value: Number) -> Number:
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("result is not a finite number")
        if abs(value) > self.max_abs:
            raise CalculatorError(f"result too large: magnitude above the limit of {self.max_abs:g}")
        if isinstance(value, Fraction):
            self._check_bits(max(value.numerator.bit_length(), value.denominator.bit_length()))
        return value

    def _check_bits(self, bits: float) -> None:
        if bits > self.max_bits:
            raise CalculatorError(
                f"result too precise: an exact fraction of about {bits:,.0f} bits (numerator or denominator); the "
                f"limit is {self.max_bits:,}. Use a decimal point to compute with floats, e.g. 0.001 ** 100")

    def _binary(self, op: ast.operator, left: Number, right: Number) -> Number:
        if isinstance(op, ast.Add):
            return left + right
        if isinstance(op, ast.Sub):
            return left - right
        if isinstance(op, ast.Mult):
            return left * right  # both operands are within max_abs, so this is cheap
        if isinstance(op, ast.Div | ast.FloorDiv | ast.Mod):
            if right == 0:
                raise CalculatorError("division by zero")
            if isinstance(op, ast.FloorDiv):
                return left // right
            if isinstance(op, ast.Mod):
                return left % right
            if isinstance(left, float) or isinstance(right, float):
                return left / right
            return Fraction(left) / Fraction(right)
        if isinstance(op, ast.Pow):
            return self._power(left, right)
        if isinstance(op, ast.BitXor):
            raise CalculatorError("'^' is not a power here: write 2 ** 10 for two to the tenth")
        raise CalculatorError(f"unsupported operator {type(op).__name__}; {_HELP}")

    def _power(self, base: Number, exponent: Number) -> Number:
        integral = exponent == math.floor(exponent)
        if integral and abs(exponent) > self.max_exponent:
            raise CalculatorError(f"exponent {exponent} is too large; the limit is {self.max_exponent}")
        if base == 0:
            if exponent < 0:
                raise CalculatorError("division by zero (zero to a negative power)")
            return 0 if exponent > 0 else 1
        # log10 of the result, checked before computing so 9 ** 9 ** 9 is refused instantly
        if float(exponent) * _log10_abs(base) > math.log10(self.max_abs) + 1:
            raise CalculatorError(f"result too large: magnitude above the limit of {self.max_abs:g}")
        if integral:
            if isinstance(base, float) or isinstance(exponent, float):
                return float(base) ** int(exponent)
            exact = Fraction(base)
            # size checked before computing: (1/999) ** 1000 has a 10,000-bit denominator
            self._check_bits(abs(int(exponent)) * math.log2(max(abs(exact.numerator), exact.denominator)))
            return exact ** int(exponent)
        if base < 0:
            raise CalculatorError("a negative number to a fractional power is not a real number")
        return float(base) ** float(exponent)

    def _call(self, node: ast.Call) -> Number:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTION_ARITY:
            shown = name or ast.unparse(node.func)[:40]
            raise CalculatorError(f"unknown function {shown!r}; {_HELP}")
        if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
            raise CalculatorError(f"{name}() takes plain positional arguments only")
        low, high = _FUNCTION_ARITY[name]
        if not low <= len(node.args) <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise CalculatorError(f"{name}() takes {expected} arguments, got {len(node.args)}")
        args = [self._visit(arg) for arg in node.args]
        if name == "abs":
            return abs(args[0])
        if name == "min":
            return min(args)
        if name == "max":
            return max(args)
        if name == "floor":
            return math.floor(args[0])
        if name == "ceil":
            return math.ceil(args[0])
        if name == "sqrt":
            if args[0] < 0:
                raise CalculatorError("square root of a negative number")
            root = math.isqrt(args[0]) if isinstance(args[0], int) else None
            return root if root is not None and root * root == args[0] else math.sqrt(args[0])
        # round(x) or round(x, digits)
        if len(args) == 2:
            digits = args[1]
            if isinstance(digits, float) or digits != int(digits) or abs(digits) > 15:
                raise CalculatorError("round()'s second argument must be an integer from -15 to 15")
            return round(args[0], int(digits))
        return round(args[0])


def _log10_abs(value: Number) -> float:
    if isinstance(value, Fraction):
        return math.log10(abs(value.numerator)) - math.log10(value.denominator)
    return math.log10(abs(value))


def format_number(value: Number) -> str:
    """Render a result deterministically: integers exactly, other values to 12 significant digits."""
    if isinstance(value, Fraction) and value.denominator == 1:
        value = int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Fraction) and _is_short_decimal(value):
        with decimal.localcontext() as context:
            context.prec = 40
            exact = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
        return format(exact.normalize(), "f")
    number = float(value)
    if number == 0 or abs(number) < 1e-6:
        return f"{number:.12g}"
    decimals = max(0, 12 - (math.floor(math.log10(abs(number))) + 1))
    text = f"{number:.{decimals}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


def _is_short_decimal(value: Fraction) -> bool:
    """True when ``value`` has a terminating decimal expansion of at most 12 decimal places."""
    denominator = value.denominator
    for factor in (2, 5):
        while denominator % factor == 0:
            denominator //= factor
    return denominator == 1 and (10**12) % value.denominator == 0


@tool(timeout_s=2.0)
def calculate(expression: str) -> ToolResult | str:
    """Evaluate an arithmetic expression exactly and return the number.

    Supports numbers, + - * / // % ** (power), parentheses, abs, round, min, max, sqrt, floor, ceil, pi and e.

    Args:
        expression: the arithmetic expression, e.g. "(4382 - 1297) + 3 * 845".
    """
    try:
        return format_number(safe_eval(expression))
    except CalculatorError as exc:
        return ToolResult.error(str(exc))
