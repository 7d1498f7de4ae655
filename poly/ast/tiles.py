"""Partial tiles: where a tile's extent does not divide its loop, the last tile runs the
loops inside it fewer times (and at a padded window's border, the loops inside its
unrolled rows). Codegen wants constant trip counts for vector and unrolled loops and
the loops inside them, so the AST generator emits full tiles apart from partial ones
(and border tiles apart from the middle ones), and the default
schedule avoids fusing a loop with partial tiles into a parallel loop (isl then needs
modulo arithmetic and guards inside the vector loops)."""

from __future__ import annotations

import islpy as isl

from polytile.poly.ir import isl_helpers as ih
from polytile.poly.ir.schedule import Schedule, parse_mark, to_isl

#: loops whose trip count codegen needs to know: expanded into copies or vector lanes
CONSTANT_TRIPS = ("vector", "unroll")

Path = tuple[int, ...]


def isolate_full_tiles(tree: isl.Schedule) -> isl.Schedule:
    """Generate each serial loop's full tiles apart from its partial ones.

    A tile that a loop's extent does not divide leaves the vector and unrolled loops
    inside with a trip count like `min(7, 168 - 8 * t)`: codegen can then neither unroll
    them nor keep a register tile's accumulators in registers. isl's `isolate` option on
    the outermost serial loop whose values decide the trip count makes it emit the full
    tiles, where every such count is constant, and the rest after them.
    An inner serial loop is isolated too when partial tiles remain inside
    an outer loop's full tiles (a tail in both `i` and `j`). A padded window's border
    tiles (`_window_border`) are set apart the same way: the middle tiles isolated, or
    the first where there is no middle, and the rest emitted piece by piece (isl's
    `separate`). Parallel loops are left whole (one outlined loop per thread team)."""
    bands = _bands(tree)
    domain = tree.get_domain()
    prefixes = _Prefixes(tree)
    rows: list[tuple[Path, isl.Set]] | None = None  # worked out once a band needs them
    isolated: list[tuple[Path, isl.Set]] = []
    for path, _loop, annotation in bands:
        if annotation:
            continue
        inner = [p for p, _, a in bands if a in CONSTANT_TRIPS and _below(p, path)]
        if not inner:
            continue
        band = _at(tree, path)
        outer = prefixes.outer(path)
        whole = isl.Set.from_union_set(outer.range())
        region = whole
        partial = _partial(prefixes, outer, inner)
        # partial tiles of a loop fused through a modulo stay: isolating those multiplies
        # isl's pieces (and the AST check's work) for little gain
        if (
            partial is not None
            and not ih.has_divs(partial)
            and not any(
                _below(path, above) and _split_off(full, partial) for above, full in isolated
            )
        ):
            region = region.subtract(partial)
        if rows is None:  # symbolic sizes leave no border constant: not set apart
            symbolic = domain.get_space().dim(isl.dim_type.param) > 0
            rows = [] if symbolic else _partial_rows(prefixes, bands)
        border = _window_border(path, rows, whole)
        if border is not None:
            interior = region.subtract(border)
            region = interior if not interior.is_empty() else ih.first_values(region)
        if region.is_equal(whole) or region.is_empty():
            continue
        option = ih.isolate_option(region.coalesce(), band.get_schedule_depth())
        band = band.band_set_ast_build_options(option)
        if border is not None:
            band = band.band_member_set_ast_loop_type(0, isl.ast_loop_type.separate)
        tree = band.get_schedule()
        isolated.append((path, region))
    return tree


def _partial_rows(
    prefixes: _Prefixes, bands: list[tuple[Path, str, str]]
) -> list[tuple[Path, isl.Set]]:
    """Each unrolled loop whose inner loops run fewer times somewhere, with where (its
    prefix values): worked out once, for every loop above it to look at."""
    found = []
    for path, _, annotation in bands:
        if annotation != "unroll":
            continue
        inner = [p for p, _, _ in bands if _below(p, path)]
        region = _partial(prefixes, prefixes.outer(path), inner)
        if region is not None and not ih.has_divs(region):
            found.append((path, region))
    return found


def _window_border(path: Path, rows: list[tuple[Path, isl.Set]], whole: isl.Set) -> isl.Set | None:
    """The values of the band at `path` (with its outer loops', `whole`) whose tiles hold
    an unrolled copy of a loop whose inner loops run fewer times (`rows`), where which
    copies do changes with the band's value: a padded window's border tiles, whose
    unrolled rows keep window column (kw) bounds like `max(0, 1 - 14 * ow0 - ow1)` in one
    code path for every tile; apart, each copy's bounds are constants. None when there
    are none."""
    depth = whole.dim(isl.dim_type.set)
    for unrolled, region in rows:
        if _below(unrolled, path) and ih.varies_with(region, whole):
            last = region.dim(isl.dim_type.set)
            return region.project_out(isl.dim_type.set, depth, last - depth)
    return None


def _split_off(full: isl.Set, partial: isl.Set) -> bool:
    """Whether an outer loop's isolated full tiles (`full`, over its prefix values) hold
    none of an inner loop's partial tiles: the outer isolation already set them apart,
    and isolating the inner loop too would only duplicate code."""
    extra = partial.dim(isl.dim_type.set) - full.dim(isl.dim_type.set)
    return ih.extend_dims(full, extra).intersect(partial).is_empty()


def has_partial_tiles(schedule: Schedule, loop: str) -> bool:
    """Whether a vector or unrolled loop nested in `loop` runs fewer times for some of
    its values (a partial tile). Other loops may vary (a padded convolution's taps at the
    border) without harm to codegen."""
    tree = to_isl(schedule)
    bands = _bands(tree)
    path = next((p for p, name, _ in bands if name == loop), None)
    if path is None:
        return False
    inner = [p for p, _, a in bands if a in CONSTANT_TRIPS and _below(p, path)]
    if not inner:
        return False
    prefixes = _Prefixes(tree)
    return _partial(prefixes, prefixes.outer(path), inner) is not None


class _Prefixes:
    """The prefix schedules of a tree's bands by path, each worked out once: every serial
    band above a vector or unrolled loop compares its own with that loop's. Setting a
    band's AST options leaves them as they are, so they serve the tree as it is isolated."""

    def __init__(self, tree: isl.Schedule) -> None:
        self.tree = tree
        self.domain = tree.get_domain()
        self._inner: dict[Path, isl.UnionMap] = {}
        self._outer: dict[Path, isl.UnionMap] = {}

    def inner(self, path: Path) -> isl.UnionMap:
        """Each instance below the band at `path` → the values of it and the loops outside."""
        if path not in self._inner:
            self._inner[path] = _at(self.tree, path).child(0).get_prefix_schedule_union_map()
        return self._inner[path]

    def outer(self, path: Path) -> isl.UnionMap:
        """`inner`, restricted to the domain's instances."""
        if path not in self._outer:
            self._outer[path] = self.inner(path).intersect_domain(self.domain)
        return self._outer[path]


def _partial(prefixes: _Prefixes, outer: isl.UnionMap, inner: list[Path]) -> isl.Set | None:
    """The values of a band (`outer`: its prefix schedule) where a loop at one of the
    `inner` paths runs less than its whole trip count; None when there are none."""
    partial: isl.Set | None = None
    for p in inner:
        found = ih.partial_trip_region(outer, prefixes.inner(p))
        if found is not None and not found.is_empty():
            partial = found if partial is None else partial.union(found)
    return partial.coalesce() if partial is not None else None


def _bands(tree: isl.Schedule) -> list[tuple[Path, str, str]]:
    """Each loop's band: its path from the root, its name and annotation (from the mark
    above it), outer loops first."""
    found: list[tuple[Path, str, str]] = []

    def walk(node: isl.ScheduleNode, path: Path) -> None:
        if node.get_type() == isl.schedule_node_type.mark:
            loop, annotation = parse_mark(node.mark_get_id().get_name())
            found.append(((*path, 0), loop, annotation))
        for index in range(node.n_children()):
            walk(node.child(index), (*path, index))

    walk(tree.get_root(), ())
    return found


def _below(inner: Path, outer: Path) -> bool:
    return len(inner) > len(outer) and inner[: len(outer)] == outer


def _at(tree: isl.Schedule, path: Path) -> isl.ScheduleNode:
    node = tree.get_root()
    for index in path:
        node = node.child(index)
    return node
