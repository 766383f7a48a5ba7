"""A node of the result-count conformance tests, at module level so worker processes import
it: every seventh item fails, the others cost one dollar."""

from __future__ import annotations

from hypernodes_dist import meter, node


@node(output_name="y")
def priced_or_broken(x: int) -> int:
    if x % 7 == 3:
        raise ValueError(f"broken item {x}")
    meter(cost=1.0)
    return x * 10
