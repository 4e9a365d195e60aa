"""Spreadsheet metrics: WAA's `metrics/table.py` (`compare_table`, `compare_csv`,
`compare_conference_city_in_order`) and the helpers it uses from `metrics/utils.py`.

Workbooks are read the way WAA reads them, with the same libraries, so that the same openpyxl
and pandas behaviour decides the score: pandas (`pd.ExcelFile` + `read_excel`, i.e. cached
values, first row as header) for `sheet_data`, openpyxl (`load_workbook`, formulas as text) for
charts, pivots, styles, freeze panes, zoom, validation, dimensions and filters, and the raw
sheet XML inside the zip for single cell values (`read_cell_value`: the cached value).

Packages: openpyxl and pandas (the 'office' extra) for every metric here; `formulas` only when a
`style` rule meets conditional formatting; rapidfuzz only for a `sheet_fuzzy` "fuzzy_match".
They are imported when used; a missing one raises MissingDependencyError (an evaluation error).

Kept WAA quirks (the default is WAA's score, even where WAA is wrong):
- `sheet_data` compares `read_excel` frames (first row as header, cached formula values, so a
  formula saved without a cached result reads as NaN) rounded to `precision` (default 4)
  digits with `DataFrame.equals`: dtypes must agree, but pandas' type inference turns the text
  "1" and a boolean TRUE in a numeric column into 1, so those compare equal to the number 1.
  `check_cell` "value" with "eq" is strict (2.0 == 2, but "2" != 2).
- `sheet_data`/`freeze`: when the *first* sheet cannot be loaded the rule fails (0); when the
  second cannot, WAA calls a method on None and raises, and so do we.
- A sheet index that is out of range (0, "RI3", "EI3") selects the sheet named "", which no
  book has; a string not starting with RI/RN/EI/EN raises ValueError.
- `style` compares, for every cell of the used range of both sheets, the listed properties read
  from openpyxl objects as they are: a colour given by theme or index has no rgb and openpyxl
  answers its placeholder text for `.rgb`, so two such colours compare equal whatever they are;
  `bgcolor` is the fill's *background* colour (LibreOffice writes a solid fill's colour as the
  foreground one). `font_color` etc. of a cell whose font has no colour raises AttributeError,
  as in WAA. Conditional formatting of any type but "expression" raises NotImplementedError; an
  expression is compiled with `formulas` and called with the cell's cached value, plus, for each
  absolute reference, a list of cell values, where WAA's own check for a single-cell reference
  never matches, so `$B$1` becomes the range "B1:" and raises ValueError.
- `chart` keys charts by their series references; "anchor" reports the end row twice
  ([editAs, from.col, to.row, to.col, to.row]); a missing title gives None.
- `pivot_table` keys pivots by the (trimmed) cache source; "filter" adds both "selection" and
  "filter_fields"; data fields are "fld;name-or-empty;subtotal;showDataAs".
- `check_cell` reads "value" from the sheet XML (numbers as float, strings from the shared
  string table, formula strings as their cached text stripped of surrounding blanks, booleans,
  errors, inline strings and dates as None) and every other property from openpyxl.
- `sheet_print` reads "<result file stem>-<sheet name>.csv" next to the workbook (the CSV
  LibreOffice exports), as lines stripped, bottom-up, trailing blank lines dropped.
- `sheet_fuzzy` with an unknown match type reuses the previous comparison's outcome (WAA's
  stale variable); with no previous one it raises.
- The sheet XML is found as `xl/worksheets/sheet<sheetId>.xml` (not through the workbook's
  relationships), as WAA does.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import operator
import os
import re
import zipfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from adapters.waa.evaluator.errors import MissingDependencyError, require
from adapters.waa.evaluator.metrics import metric

# -- what compare_table understands ----------------------------------------------------------------

#: Every rule `type` WAA's compare_table implements (all of them are implemented here).
SUPPORTED_RULE_TYPES: frozenset[str] = frozenset({
    "sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "sparkline", "chart", "style",
    "freeze", "zoom", "data_validation", "row_props", "col_props", "filter", "pivot_table",
    "check_cell",
})

#: The keys each rule type reads (besides "type"); other keys are ignored, as in WAA.
RULE_KEYS: dict[str, frozenset[str]] = {
    "sheet_name": frozenset(),
    "sheet_data": frozenset({"sheet_idx0", "sheet_idx1", "precision"}),
    "sheet_print": frozenset({"sheet_idx0", "sheet_idx1", "ignore_case"}),
    "sheet_fuzzy": frozenset({"sheet_idx0", "sheet_idx1", "rules"}),
    "sparkline": frozenset({"sheet_idx0", "sheet_idx1"}),
    "chart": frozenset({"sheet_idx0", "sheet_idx1", "chart_props"}),
    "style": frozenset({"sheet_idx0", "sheet_idx1", "props"}),
    "freeze": frozenset({"sheet_idx0", "sheet_idx1"}),
    "zoom": frozenset({"sheet_idx", "method", "ref"}),
    "data_validation": frozenset({"sheet_idx", "dv_props"}),
    "row_props": frozenset({"sheet_idx0", "sheet_idx1", "props"}),
    "col_props": frozenset({"sheet_idx0", "sheet_idx1", "props"}),
    "filter": frozenset({"sheet_idx0", "sheet_idx1"}),
    "pivot_table": frozenset({"sheet_idx0", "sheet_idx1", "pivot_props"}),
    "check_cell": frozenset({"sheet_idx", "coordinate", "props"}),
}

SUPPORTED_CHART_PROPS: frozenset[str] = frozenset({
    "title", "legend", "anchor", "width", "height", "type", "direction", "xtitle", "ytitle", "ztitle",
})
SUPPORTED_PIVOT_PROPS: frozenset[str] = frozenset({
    "name", "show_total", "show_empty_row", "show_empty_col", "show_headers", "location",
    "selection", "ordered", "filter", "col_fields", "row_fields", "data_fields", "data_fields_name",
})
SUPPORTED_STYLE_PROPS: frozenset[str] = frozenset({
    "number_format", "font_name", "font_family", "font_color", "font_bold", "font_italic",
    "font_underline", "font_size", "fill_type", "bgcolor", "fgcolor", "hyperlink",
})
SUPPORTED_FUZZY_TYPES: frozenset[str] = frozenset({"includes", "included_by", "fuzzy_match", "exact_match"})
_PLAIN_METHODS = frozenset({"eq", "ne", "le", "lt", "ge", "gt"})


def _method_supported(method: Any) -> bool:
    if not isinstance(method, str):
        return False
    if method.startswith("re"):
        return all(isinstance(getattr(re, flag, None), re.RegexFlag) for flag in method.split(".")[1:])
    if method in _PLAIN_METHODS or method in ("spreadsheet_range", "str_list_eq", "str_set_eq"):
        return True
    if method.startswith("approx:"):
        try:
            float(method.split(":")[1])
        except ValueError:
            return False
        return True
    return method.startswith("range.") and len(method) >= 8 and method[6] in "et" and method[7] in "et"


def unsupported_rule_options(rules: Any) -> list[str]:
    """What in a compare_table `rules` list this module would not understand (unknown rule
    types, chart/pivot/style properties, fuzzy match types, match methods), each described
    once; [] when everything is supported. Never raises."""
    problems: dict[str, None] = {}
    if not isinstance(rules, list):
        return ["rules is not a list"]
    for rule in rules:
        if not isinstance(rule, dict) or rule.get("type") not in SUPPORTED_RULE_TYPES:
            problems[f"rule type {rule.get('type') if isinstance(rule, dict) else rule!r}"] = None
            continue
        kind = rule["type"]
        for key in rule:
            if key != "type" and key not in RULE_KEYS[kind]:
                problems[f"{kind}: option {key!r}"] = None
        wanted: list[tuple[str, frozenset[str], Any]] = []
        if kind == "chart":
            wanted.append(("chart_props", SUPPORTED_CHART_PROPS, rule.get("chart_props", [])))
        elif kind == "pivot_table":
            wanted.append(("pivot_props", SUPPORTED_PIVOT_PROPS, rule.get("pivot_props", [])))
        elif kind == "style":
            wanted.append(("props", SUPPORTED_STYLE_PROPS, rule.get("props", [])))
        elif kind == "check_cell":
            props = rule.get("props", {})
            wanted.append(("props", SUPPORTED_STYLE_PROPS | {"value"}, list(props) if isinstance(props, dict) else []))
            for prop_rule in props.values() if isinstance(props, dict) else []:
                if not isinstance(prop_rule, dict) or not _method_supported(prop_rule.get("method")):
                    problems[f"check_cell: match rule {prop_rule!r}"] = None
        elif kind == "zoom" and not _method_supported(rule.get("method")):
            problems[f"zoom: method {rule.get('method')!r}"] = None
        elif kind == "sheet_fuzzy":
            for sub in rule.get("rules", []):
                if not isinstance(sub, dict) or sub.get("type") not in SUPPORTED_FUZZY_TYPES:
                    problems[f"sheet_fuzzy: match type {sub.get('type') if isinstance(sub, dict) else sub!r}"] = None
        elif kind == "data_validation":
            for props in rule.get("dv_props", []):
                for prop_rule in props.values() if isinstance(props, dict) else []:
                    if not isinstance(prop_rule, dict) or not _method_supported(prop_rule.get("method")):
                        problems[f"data_validation: match rule {prop_rule!r}"] = None
        for key, known, names in wanted:
            for name in names if isinstance(names, list) else [names]:
                if name not in known:
                    problems[f"{kind}: {key} {name!r}"] = None
    return list(problems)


# -- optional packages -----------------------------------------------------------------------------


def _office(what: str) -> tuple[Any, Any]:
    return (
        require("openpyxl", what=what, packages="openpyxl and pandas", extra="office"),
        require("pandas", what=what, packages="openpyxl and pandas", extra="office"),
    )


def _formulas_parser() -> Any:
    try:
        import formulas
    except ImportError as exc:
        raise MissingDependencyError(
            "compare_table (style rule on conditional formatting)", "formulas", extra="office"
        ) from exc
    return formulas.Parser()


def _fuzz_ratio(a: str, b: str) -> float:
    fuzz = require("rapidfuzz.fuzz", what="compare_table (sheet_fuzzy fuzzy_match)", packages="rapidfuzz", extra="office")
    return fuzz.ratio(a, b)


# -- raw sheet XML (WAA utils.read_cell_value / load_sparklines) -------------------------------------

_NS_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_NS_X14 = "http://schemas.microsoft.com/office/spreadsheetml/2009/9/main"
_NS_XM = "http://schemas.microsoft.com/office/excel/2006/main"


def _q(ns: str, tag: str) -> str:
    return f"{{{ns}}}{tag}"


def _element_text(elem: ET.Element | None) -> str | None:
    """An element's text as xmltodict gives it (WAA parses cells with xmltodict): all text
    inside, stripped, and None when that is empty."""
    if elem is None:
        return None
    text = "".join(elem.itertext()).strip()
    return text or None


class _SharedStringsUnavailable:
    """Marks a workbook whose shared-string table WAA could not read."""


@dataclass
class _ZipXml:
    """Parsed pieces of one xlsx file, read once per compare_table call."""

    path: str
    shared: list[str] | _SharedStringsUnavailable | None = None
    sheet_ids: dict[str, str] | None = None
    sheets: dict[str, ET.Element] = field(default_factory=dict)
    cells: dict[str, dict[str, ET.Element]] = field(default_factory=dict)

    def _read(self, member: str) -> bytes:
        with zipfile.ZipFile(self.path, "r") as archive:
            with archive.open(member) as handle:
                return handle.read()

    def shared_strings(self) -> list[str] | _SharedStringsUnavailable:
        if self.shared is None:
            try:
                root = ET.fromstring(self._read("xl/sharedStrings.xml"))
                strings: list[str] = []
                for item in root.findall(_q(_NS_MAIN, "si")) if root.tag == _q(_NS_MAIN, "sst") else []:
                    # WAA joins the text of every <t> below the item (runs, phonetic runs too);
                    # an empty <t/> makes its join fail and the whole table unreadable.
                    parts = [t.text for t in item.iter(_q(_NS_MAIN, "t"))]
                    if any(part is None for part in parts):
                        raise TypeError("empty <t> in sharedStrings.xml")
                    strings.append("".join(parts))  # type: ignore[arg-type]
                self.shared = strings
            except Exception:  # noqa: BLE001 - WAA's bare except: no usable table
                self.shared = _SharedStringsUnavailable()
        return self.shared

    def sheet_root(self, sheet_name: str) -> ET.Element:
        if self.sheet_ids is None:
            root = ET.fromstring(self._read("xl/workbook.xml"))
            ids: dict[str, str] = {}
            for sheets in root.iter(_q(_NS_MAIN, "sheets")):
                for sheet in sheets.findall(_q(_NS_MAIN, "sheet")):
                    ids[sheet.get("name")] = sheet.get("sheetId")  # type: ignore[index]
            self.sheet_ids = ids
        sheet_id = self.sheet_ids[sheet_name]  # KeyError for an unknown sheet, as in WAA
        if sheet_name not in self.sheets:
            self.sheets[sheet_name] = ET.fromstring(self._read(f"xl/worksheets/sheet{sheet_id}.xml"))
        return self.sheets[sheet_name]

    def cell(self, sheet_name: str, coordinate: str) -> ET.Element | None:
        root = self.sheet_root(sheet_name)
        if sheet_name not in self.cells:
            index: dict[str, ET.Element] = {}
            for row in root.iter(_q(_NS_MAIN, "row")):
                for cell in row.findall(_q(_NS_MAIN, "c")):
                    ref = cell.get("r")
                    if ref is not None and ref not in index:
                        index[ref] = cell
            self.cells[sheet_name] = index
        return self.cells[sheet_name].get(coordinate)


class _XmlCache:
    def __init__(self) -> None:
        self._books: dict[str, _ZipXml] = {}

    def book(self, path: Any) -> _ZipXml:
        key = os.fspath(path)
        if key not in self._books:
            self._books[key] = _ZipXml(key)
        return self._books[key]


def read_cell_value(xlsx_file: Any, sheet_name: str, coordinate: str, cache: _XmlCache | None = None) -> Any:
    """WAA `utils.read_cell_value`: a cell's cached value straight from the sheet XML.

    Numbers (no `t` or t="n") as float, t="s" from the shared strings, t="str" (formula text
    results) as stripped text; any other type (b, e, inlineStr, d), a cell without a value or
    with a non-numeric number gives None; a coordinate with no <c> gives None; a file that is
    not a zip gives None. An unknown sheet name or a missing sheet part raises KeyError, and a
    t="s" cell in a book whose shared-string table is unreadable raises, as in WAA.
    """
    book = (cache or _XmlCache()).book(xlsx_file)
    try:
        shared = book.shared_strings()
        cell = book.cell(sheet_name, coordinate)
    except zipfile.BadZipFile:
        return None
    if cell is None:
        return None
    kind = cell.get("t")
    raw = _element_text(cell.find(_q(_NS_MAIN, "v")))
    has_value = cell.find(_q(_NS_MAIN, "v")) is not None
    try:
        if kind is None or kind == "n":
            if not has_value:
                raise KeyError("v")
            return float(raw)  # type: ignore[arg-type] - float(None) raises TypeError, as WAA does
        if kind == "s":
            if not has_value:
                raise KeyError("v")
            if isinstance(shared, _SharedStringsUnavailable):
                raise UnboundLocalError(f"{xlsx_file}: shared strings unreadable, cannot resolve {coordinate}")
            return shared[int(raw)]  # type: ignore[arg-type]
        if kind == "str":
            if not has_value:
                raise KeyError("v")
            return raw
    except (KeyError, ValueError):
        return None
    return None


def load_sparklines(xlsx_file: Any, sheet_name: str, cache: _XmlCache | None = None) -> dict[str, Any]:
    """WAA `utils.load_sparklines`: {sparkline cells (xm:sqref): data range (xm:f)} of a sheet;
    {} for a file that is not a zip; an unknown sheet raises KeyError."""
    book = (cache or _XmlCache()).book(xlsx_file)
    try:
        root = book.sheet_root(sheet_name)
    except zipfile.BadZipFile:
        return {}
    found: dict[str, Any] = {}
    for spark in root.iter(_q(_NS_X14, "sparkline")):
        sqref, formula = spark.find(_q(_NS_XM, "sqref")), spark.find(_q(_NS_XM, "f"))
        if sqref is None or formula is None:
            raise KeyError("sparkline without xm:sqref or xm:f")
        found[_element_text(sqref)] = _element_text(formula)  # type: ignore[index]
    return found


# -- value rules (WAA utils._match_value_to_rule) ----------------------------------------------------


def _range_within(inner: Any, outer: Any) -> bool:
    return all(rng in outer for rng in inner)


def match_value_to_rule(value: Any, rule: dict[str, Any]) -> bool:
    """WAA `utils._match_value_to_rule`: does `value` satisfy {"method", "ref"}?

    "re[.FLAG...]" re.search(ref, value); "eq"/"ne"/"le"/"lt"/"ge"/"gt" the operator with plain
    Python semantics; "approx:T" |float(value) - ref| <= T (False if value is not a number);
    "spreadsheet_range" ref[0] within value within ref[1] (cell ranges); "range.XY" with X, Y in
    e/t (ref[0] <(=) value <(=) ref[1]); "str_list_eq"/"str_set_eq" value split on "," after
    stripping quotes, compared as list/set with ref. Anything else raises NotImplementedError.
    """
    method = rule["method"]
    if method.startswith("re"):
        flags = functools.reduce(operator.or_, (getattr(re, name) for name in method.split(".")[1:]), re.RegexFlag(0))
        return re.search(rule["ref"], value, flags) is not None
    if method in _PLAIN_METHODS:
        return getattr(operator, method)(value, rule["ref"])
    if method.startswith("approx"):
        tolerance = float(method.split(":")[1])
        try:
            number = float(value)
        except (ValueError, TypeError):
            return False
        return abs(number - rule["ref"]) <= tolerance
    if method == "spreadsheet_range":
        from openpyxl.worksheet.cell_range import MultiCellRange

        lower, upper = MultiCellRange(rule["ref"][0]), MultiCellRange(rule["ref"][1])
        return _range_within(lower, value) and _range_within(value, upper)
    if method.startswith("range."):
        left, right = method[6], method[7]
        return getattr(operator, "l" + left)(rule["ref"][0], value) and getattr(operator, "l" + right)(value, rule["ref"][1])
    if method in ("str_list_eq", "str_set_eq"):
        container = getattr(builtins, method[4:-3])
        return container(value.strip("\"'").split(",")) == container(rule["ref"])
    raise NotImplementedError(f"unknown match method {method!r}")


# -- openpyxl readers (WAA utils) --------------------------------------------------------------------


def read_cell_style(style_name: str, cell: Any, diff_style: Any = None) -> Any:
    """WAA `utils._read_cell_style`: one style property of a cell, or of a conditional format's
    differential style when `diff_style` is given. Font properties and number_format are None
    for an empty cell; fill properties fall back to None on any error; an unknown name raises
    NotImplementedError."""
    source = diff_style or cell
    has_value = cell.value is not None
    if style_name == "number_format":
        if not (has_value and cell.data_type == "n"):
            return None
        return cell.number_format if diff_style is None else diff_style.numFmt.formatCode
    font_attr = {
        "font_name": "name", "font_family": "family", "font_bold": "bold", "font_italic": "italic",
        "font_underline": "underline", "font_size": "size",
    }
    if style_name in font_attr:
        return getattr(source.font, font_attr[style_name]) if has_value else None
    if style_name == "font_color":
        return source.font.color.rgb if has_value else None
    if style_name in ("fill_type", "bgcolor", "fgcolor"):
        try:
            fill = source.fill
            if style_name == "fill_type":
                return fill.tagname
            return (fill.bgColor if style_name == "bgcolor" else fill.fgColor).rgb
        except Exception:  # noqa: BLE001 - WAA's bare except
            return None
    if style_name == "hyperlink":
        return (cell.hyperlink or "") if has_value else None
    raise NotImplementedError(f"Unsupported Style: {style_name}")


def _series_ref(data: Any) -> str:
    for kind in ("numRef", "strRef"):
        ref = getattr(data, kind, None) if data is not None else None
        if data is not None and hasattr(data, kind) and hasattr(ref, "f"):
            return ref.f
    return ""


def _rich_title(title_owner: Any) -> Any:
    try:
        return title_owner.title.tx.rich.p[0].r[0].t
    except Exception:  # noqa: BLE001 - WAA: any failure is "no title"
        return None


def load_charts(workbook: Any, sheet_name: str, **options: Any) -> dict[str, Any]:
    """WAA `utils.load_charts`: {"<val ref>,<cat ref>;...": {prop: value}} for the charts of a
    sheet (a later chart with the same series replaces an earlier one); {} for an unknown sheet."""
    try:
        worksheet = workbook[sheet_name]
    except KeyError:
        return {}
    wanted = set(options["chart_props"]) if "chart_props" in options else set()
    charts: dict[str, Any] = {}
    for chart in worksheet._charts:
        key = ";".join(f"{_series_ref(s.val)},{_series_ref(s.cat)}" for s in chart.series)
        info: dict[str, Any] = {}
        if "title" in wanted:
            info["title"] = _rich_title(chart)
        if "legend" in wanted:
            info["legend"] = chart.legend.position if chart.legend is not None else None
        if "anchor" in wanted:
            anchor = chart.anchor
            info["anchor"] = [anchor.editAs, anchor._from.col, anchor.to.row, anchor.to.col, anchor.to.row]
        if "width" in wanted:
            info["width"] = chart.width
        if "height" in wanted:
            info["height"] = chart.height
        if "type" in wanted:
            info["type"] = chart.tagname
        if "direction" in wanted:
            info["direction"] = chart.barDir
        for axis in ("x", "y", "z"):
            if f"{axis}title" in wanted:
                try:
                    owner = getattr(chart, f"{axis}_axis")
                except Exception:  # noqa: BLE001
                    owner = None
                info[f"{axis}title"] = _rich_title(owner)
        charts[key] = info
    return charts


def _trim_empty(rows: list[list[Any]]) -> tuple[list[list[Any]], int, int]:
    start = 0
    while start < len(rows) and not rows[start]:
        start += 1
    end = len(rows)
    while end > start and not rows[end - 1]:
        end -= 1
    return rows[start:end], start, len(rows) - end


def load_pivot_tables(workbook: Any, sheet_name: str, **options: Any) -> dict[str, Any]:
    """WAA `utils.load_pivot_tables`: {"<source type>;<first cell>:<last cell>;<sheet>": {prop:
    value}} for the pivot tables on a sheet; {} for an unknown sheet. The source range is
    narrowed by the leading/trailing pivot fields that have no items, and field indices are
    shifted by the leading ones, as in WAA."""
    from openpyxl.utils import coordinate_to_tuple

    try:
        worksheet = workbook[sheet_name]
    except KeyError:
        return {}
    wanted = set(options.get("pivot_props", []))
    pivots: dict[str, Any] = {}
    for pivot in worksheet._pivots:
        raw = [[(item.h, item.x) for item in fld.items if item.x is not None] for fld in pivot.pivotFields]
        selection, left, right = _trim_empty(raw)
        source = pivot.cache.cacheSource
        first, last = source.worksheetSource.ref.split(":")
        row1, col1 = coordinate_to_tuple(first)
        row2, col2 = coordinate_to_tuple(last)
        key = f"{source.type};{(row1, col1 + left)}:{(row2, col2 - right)};{source.worksheetSource.sheet}"

        info: dict[str, Any] = {}
        if "name" in wanted:
            info["name"] = pivot.name
        if "show_total" in wanted:
            info["show_total"] = pivot.visualTotals
        if "show_empty_row" in wanted:
            info["show_empty_row"] = pivot.showEmptyRow
        if "show_empty_col" in wanted:
            info["show_empty_col"] = pivot.showEmptyCol
        if "show_headers" in wanted:
            info["show_headers"] = pivot.showHeaders
        if "location" in wanted:
            info["location"] = pivot.location
        if "filter" in wanted or "selection" in wanted:
            info["selection"] = selection if "ordered" in wanted else [set(items) for items in selection]
        if "filter" in wanted:
            info["filter_fields"] = {fld.fld for fld in pivot.pageFields}
        if "col_fields" in wanted:
            info["col_fields"] = [fld.x - left for fld in pivot.colFields]
        if "row_fields" in wanted:
            info["row_fields"] = [fld.x - left for fld in pivot.rowFields]
        if "data_fields" in wanted:
            named = "data_fields_name" in wanted
            info["data_fields"] = [
                "{:d};{};{};{}".format(fld.fld - left, fld.name if named else "", fld.subtotal, fld.showDataAs)
                for fld in pivot.dataFields
            ]
        pivots[key] = info
    return pivots


# `$A$1` or `$A$1:$B$2`: the absolute references WAA passes to a conditional-format expression.
_ABSOLUTE_REF = re.compile(r"\$([A-Z]{1,3})\$(\d+)(?::\$([A-Z]{1,3})\$(\d+))?")


def load_xlsx_styles(workbook: Any, sheet_name: str, book_path: Any, cache: _XmlCache | None = None,
                     **options: Any) -> dict[str, list[Any]]:
    """WAA `utils.load_xlsx_styles`: {coordinate: [the `props` of that cell]} for every cell of
    the sheet's used range, then overwritten for the cells an "expression" conditional format
    makes active (with the format's differential style). {} for an unknown sheet; any other
    kind of conditional format raises NotImplementedError."""
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import CellRange

    try:
        worksheet = workbook[sheet_name]
    except KeyError:
        return {}
    cache = cache or _XmlCache()
    props = options.get("props", [])
    styles: dict[str, list[Any]] = {}
    for column in worksheet.iter_cols():
        for cell in column:
            styles[cell.coordinate] = [read_cell_style(name, cell) for name in props]

    parser = None
    for cf in worksheet.conditional_formatting:
        for cf_rule in cf.rules:
            active: list[Any] = []
            if cf_rule.type != "expression":
                raise NotImplementedError(f"Not Implemented Condition Type: {cf_rule.type}")
            if parser is None:
                parser = _formulas_parser()
            formula = cf_rule.formula[0]
            condition = parser.ast("=" + formula)[1].compile()
            arguments: list[Any] = []
            for col1, row1, col2, row2 in _ABSOLUTE_REF.findall(formula):
                # WAA tests the optional groups against None, but findall gives "" for them, so
                # a single absolute cell is always read as a range "A1:" (which raises).
                block = CellRange(f"{col1}{row1}:{col2}{row2}")
                arguments.append([
                    read_cell_value(book_path, sheet_name, f"{get_column_letter(c)}{r}", cache)
                    for r, c in block.cells
                ])
            for block in cf.cells:
                for r, c in block.cells:
                    target = worksheet.cell(row=r, column=c)
                    value = read_cell_value(book_path, sheet_name, f"{get_column_letter(c)}{r}", cache)
                    if condition(value, *arguments):
                        active.append(target)
            for target in active:
                styles[target.coordinate] = [read_cell_style(name, target, cf_rule.dxf) for name in props]
    return styles


def load_rows_or_cols(workbook: Any, sheet_name: str, **options: Any) -> dict[Any, dict[str, Any]]:
    """WAA `utils.load_rows_or_cols`: {row number | column letter: {prop: value}} over the
    sheet's row/column dimension entries (`obj` "row" or "column"); {} for an unknown sheet."""
    try:
        worksheet = workbook[sheet_name]
    except KeyError:
        return {}
    dimensions = getattr(worksheet, f"{options['obj']}_dimensions")
    wanted = set(options.get("props", []))
    return {key: {prop: getattr(dim, prop) for prop in wanted} for key, dim in dimensions.items()}


def load_filters(workbook: Any, sheet_name: str, **options: Any) -> dict[str, Any]:
    """WAA `utils.load_filters`: the sheet's autofilter (ref, filter columns sorted by column
    id, sort state); {} for an unknown sheet."""
    try:
        worksheet = workbook[sheet_name]
    except KeyError:
        return {}
    auto = worksheet.auto_filter
    columns: list[dict[str, Any]] = []
    for column in auto.filterColumn:
        entry: dict[str, Any] = {
            "col_id": column.colId, "hidden_button": column.hiddenButton, "show_button": column.showButton,
        }
        if column.filters is not None:
            entry["filters_blank"] = column.filters.blank
            entry["filters"] = set(column.filters.filter)
        if column.customFilters is not None:
            entry["custom_filters_op"] = column.customFilters._and
            entry["custom_filters"] = {(flt.operator, flt.val) for flt in column.customFilters.customFilter}
        columns.append(entry)
    found: dict[str, Any] = {"ref": auto.ref, "filter_column": sorted(columns, key=lambda e: e["col_id"])}
    sort_state = auto.sortState
    if sort_state is not None:
        found["sort_state"] = {
            "sort": sort_state.columnSort,
            "case": sort_state.caseSensitive,
            "method": sort_state.sortMethod,
            "ref": sort_state.ref,
            "condition": [
                {"descending": c.descending, "key": c.sortBy, "ref": c.ref, "custom_list": c.customList,
                 "dxf_id": c.dxfId, "icon": c.iconSet, "iconid": c.iconId}
                for c in sort_state.sortCondition
            ],
        }
    return found


# -- compare_table -------------------------------------------------------------------------------------


@dataclass
class _Books:
    """The two workbooks as WAA holds them: as paths, openpyxl Workbooks and pandas ExcelFiles."""

    result_path: Any
    expected_path: Any
    xl_result: Any
    xl_expected: Any
    pd_result: Any
    pd_expected: Any
    result_names: list[str]
    expected_names: list[str] | None
    xml: _XmlCache = field(default_factory=_XmlCache)
    last_metric: Any = None
    has_metric: bool = False

    def locate(self, sheet_idx: Any, result_book: Any, expected_book: Any) -> tuple[Any, str]:
        """WAA `_parse_sheet_idx`: an int or "RI<n>" indexes the result's sheets, "RN<name>"
        names one, "EI<n>"/"EN<name>" the expected book's. A bad index becomes the name ""."""

        def pick(names: Any, position: Any) -> str:
            try:
                return names[position]
            except Exception:  # noqa: BLE001 - WAA's bare except
                return ""

        def number(text: str) -> Any:
            try:
                return int(text)
            except Exception:  # noqa: BLE001
                return None

        if isinstance(sheet_idx, int):
            return result_book, pick(self.result_names, sheet_idx)
        if not isinstance(sheet_idx, str):
            raise AttributeError(f"sheet index {sheet_idx!r} is neither an int nor a string")
        prefix, rest = sheet_idx[:2], sheet_idx[2:]
        if prefix == "RI":
            return result_book, pick(self.result_names, number(rest))
        if prefix == "RN":
            return result_book, rest
        if prefix == "EI":
            return expected_book, pick(self.expected_names, number(rest))
        if prefix == "EN":
            return expected_book, rest
        raise ValueError(f"Unrecognized sheet index {sheet_idx!r}")

    def paths(self, sheet_idx: Any) -> tuple[Any, str]:
        return self.locate(sheet_idx, self.result_path, self.expected_path)

    def frames(self, sheet_idx: Any) -> tuple[Any, str]:
        return self.locate(sheet_idx, self.pd_result, self.pd_expected)

    def workbooks(self, sheet_idx: Any) -> tuple[Any, str]:
        return self.locate(sheet_idx, self.xl_result, self.xl_expected)


def _load_sheet(book: Any, name: str) -> Any:
    """WAA `_load_sheet`: a CSV export's lines (book a path), a DataFrame (pandas ExcelFile) or a
    Worksheet (openpyxl Workbook); None when loading fails; another kind of book (None, e.g. an
    "E..." index without an expected file) raises NotImplementedError."""
    from openpyxl import Workbook
    from pandas import ExcelFile, read_excel

    try:
        if isinstance(book, str):  # not os.PathLike: a pandas ExcelFile is one
            csv_name = f"{os.path.splitext(book)[0]}-{name}.csv"
            with open(csv_name, encoding="utf-8") as handle:
                stripped = (line.strip() for line in reversed(handle.read().splitlines()))
                return list(itertools.dropwhile(lambda line: len(line) == 0, stripped))
        if isinstance(book, ExcelFile):
            return read_excel(book, name)
        if isinstance(book, Workbook):
            return book[name]
    except Exception:  # noqa: BLE001 - WAA's bare except
        return None
    raise NotImplementedError("Not supported workbook format")


def _rule_sheet_name(books: _Books, rule: dict[str, Any]) -> bool:
    return books.result_names == books.expected_names


def _rule_sheet_data(books: _Books, rule: dict[str, Any]) -> bool:
    digits = rule.get("precision", 4)
    first = _load_sheet(*books.frames(rule["sheet_idx0"]))
    if first is None:
        return False
    second = _load_sheet(*books.frames(rule["sheet_idx1"]))
    if second is None:
        raise AttributeError(f"sheet_data: sheet {rule['sheet_idx1']!r} cannot be loaded (WAA: None.round)")
    return bool(first.round(digits).equals(second.round(digits)))


def _rule_sheet_print(books: _Books, rule: dict[str, Any]) -> bool:
    first = _load_sheet(*books.paths(rule["sheet_idx0"]))
    if first is None:
        return False
    second = _load_sheet(*books.paths(rule["sheet_idx1"]))
    if rule.get("ignore_case", False):
        first = [line.lower() for line in first]
        if second is None:
            raise TypeError(f"sheet_print: no CSV export for sheet {rule['sheet_idx1']!r} (WAA iterates None)")
        second = [line.lower() for line in second]
    return first == second


def _rule_sheet_fuzzy(books: _Books, rule: dict[str, Any]) -> bool:
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import MultiCellRange

    first = books.paths(rule["sheet_idx0"])
    second = books.paths(rule["sheet_idx1"])
    everything = True
    for sub in rule["rules"]:
        for block in MultiCellRange(sub["range"]):
            for row, col in block.cells:
                coordinate = f"{get_column_letter(col)}{row:d}"
                a = str(read_cell_value(*first, coordinate, books.xml))
                b = str(read_cell_value(*second, coordinate, books.xml))
                for old, new in sub.get("normalization", []):
                    a, b = a.replace(old, new), b.replace(old, new)
                if "trim_leadings" in sub:
                    a, b = a.lstrip(sub["trim_leadings"]), b.lstrip(sub["trim_leadings"])
                if "trim_trailings" in sub:
                    a, b = a.rstrip(sub["trim_trailings"]), b.rstrip(sub["trim_trailings"])
                if "ignore_chars" in sub:
                    dropped = set(sub["ignore_chars"])
                    a = "".join(ch for ch in a if ch not in dropped)
                    b = "".join(ch for ch in b if ch not in dropped)
                if sub.get("ignore_case", False):
                    a, b = a.lower(), b.lower()
                kind = sub["type"]
                if kind == "includes":
                    outcome: Any = b in a
                elif kind == "included_by":
                    outcome = a in b
                elif kind == "fuzzy_match":
                    outcome = _fuzz_ratio(a, b) >= sub.get("threshold", 85.0)
                elif kind == "exact_match":
                    outcome = a == b
                elif books.has_metric:
                    outcome = books.last_metric  # WAA's stale `metric` variable
                else:
                    raise UnboundLocalError(f"sheet_fuzzy: unknown match type {kind!r} with no earlier outcome")
                books.last_metric, books.has_metric = outcome, True
                everything = everything and outcome
    return everything


def _rule_sparkline(books: _Books, rule: dict[str, Any]) -> bool:
    return load_sparklines(*books.paths(rule["sheet_idx0"]), books.xml) == \
        load_sparklines(*books.paths(rule["sheet_idx1"]), books.xml)


def _rule_chart(books: _Books, rule: dict[str, Any]) -> bool:
    return load_charts(*books.workbooks(rule["sheet_idx0"]), **rule) == load_charts(*books.workbooks(rule["sheet_idx1"]), **rule)


def _rule_style(books: _Books, rule: dict[str, Any]) -> bool:
    def styles(idx: Any) -> dict[str, list[Any]]:
        workbook, name = books.workbooks(idx)
        path = books.paths(idx)[0]
        return load_xlsx_styles(workbook, name, path, books.xml, **rule)

    return styles(rule["sheet_idx0"]) == styles(rule["sheet_idx1"])


def _rule_freeze(books: _Books, rule: dict[str, Any]) -> bool:
    first = _load_sheet(*books.workbooks(rule["sheet_idx0"]))
    if first is None:
        return False
    second = _load_sheet(*books.workbooks(rule["sheet_idx1"]))
    if second is None:
        raise AttributeError(f"freeze: sheet {rule['sheet_idx1']!r} does not exist (WAA: None.freeze_panes)")
    return first.freeze_panes == second.freeze_panes


def _rule_zoom(books: _Books, rule: dict[str, Any]) -> bool:
    sheet = _load_sheet(*books.workbooks(rule["sheet_idx"]))
    if sheet is None:
        return False
    return match_value_to_rule(sheet.sheet_view.zoomScale or 100.0, rule)


def _rule_data_validation(books: _Books, rule: dict[str, Any]) -> bool:
    sheet = _load_sheet(*books.workbooks(rule["sheet_idx"]))
    if sheet is None:
        return False
    validators = sheet.data_validations.dataValidation
    wanted = rule["dv_props"]
    everything = len(validators) >= len(wanted)
    for validator in validators:
        matched = False
        for props in wanted:
            matched = matched or all(match_value_to_rule(getattr(validator, attr), how) for attr, how in props.items())
            if matched:
                break
        everything = everything and matched
        if not everything:
            break
    return everything


def _dimension_options(rule: dict[str, Any], obj: str) -> dict[str, Any]:
    if "obj" in rule:  # WAA passes obj= and **rule together: a duplicate keyword
        raise TypeError("load_rows_or_cols() got multiple values for keyword argument 'obj'")
    return {**rule, "obj": obj}


def _rule_row_props(books: _Books, rule: dict[str, Any]) -> bool:
    options = _dimension_options(rule, "row")
    return load_rows_or_cols(*books.workbooks(rule["sheet_idx0"]), **options) == \
        load_rows_or_cols(*books.workbooks(rule["sheet_idx1"]), **options)


def _rule_col_props(books: _Books, rule: dict[str, Any]) -> bool:
    options = _dimension_options(rule, "column")
    return load_rows_or_cols(*books.workbooks(rule["sheet_idx0"]), **options) == \
        load_rows_or_cols(*books.workbooks(rule["sheet_idx1"]), **options)


def _rule_filter(books: _Books, rule: dict[str, Any]) -> bool:
    return load_filters(*books.workbooks(rule["sheet_idx0"]), **rule) == load_filters(*books.workbooks(rule["sheet_idx1"]), **rule)


def _rule_pivot_table(books: _Books, rule: dict[str, Any]) -> bool:
    return load_pivot_tables(*books.workbooks(rule["sheet_idx0"]), **rule) == \
        load_pivot_tables(*books.workbooks(rule["sheet_idx1"]), **rule)


def _rule_check_cell(books: _Books, rule: dict[str, Any]) -> Any:
    sheet = _load_sheet(*books.workbooks(rule["sheet_idx"]))
    if sheet is None:
        return False
    cell = sheet[rule["coordinate"]]
    outcome: Any = True
    for prop, how in rule["props"].items():
        if prop == "value":
            value = read_cell_value(*books.paths(rule["sheet_idx"]), rule["coordinate"], books.xml)
        else:
            value = read_cell_style(prop, cell)
        outcome = outcome and match_value_to_rule(value, how)  # short-circuits like WAA's `and`
    return outcome


_RULES = {
    "sheet_name": _rule_sheet_name,
    "sheet_data": _rule_sheet_data,
    "sheet_print": _rule_sheet_print,
    "sheet_fuzzy": _rule_sheet_fuzzy,
    "sparkline": _rule_sparkline,
    "chart": _rule_chart,
    "style": _rule_style,
    "freeze": _rule_freeze,
    "zoom": _rule_zoom,
    "data_validation": _rule_data_validation,
    "row_props": _rule_row_props,
    "col_props": _rule_col_props,
    "filter": _rule_filter,
    "pivot_table": _rule_pivot_table,
    "check_cell": _rule_check_cell,
}
assert set(_RULES) == SUPPORTED_RULE_TYPES


@metric("compare_table", files=2)
def compare_table(result: Any, expected: Any = None, **options: Any) -> float:
    """WAA `compare_table` (metrics/table.py): 1.0 iff every rule of `options["rules"]` holds,
    checked in order and stopping at the first that fails.

    A None result, or a result that openpyxl or pandas cannot open, scores 0; an expected file
    that cannot be opened raises. Without `expected`, rules that touch the expected book raise
    (NotImplementedError) or fail, as in WAA. An unknown rule type raises NotImplementedError
    when it is reached. See the module docstring for the rule semantics and the WAA quirks kept.
    Needs openpyxl and pandas (the 'office' extra).
    """
    openpyxl, pandas = _office("compare_table")
    if result is None:
        return 0.0
    opened: list[Any] = []
    try:
        try:
            xl_result = openpyxl.load_workbook(filename=result)
            pd_result = pandas.ExcelFile(result)
            opened.append(pd_result)
        except Exception:  # noqa: BLE001 - WAA's bare except: an unreadable result scores 0
            return 0.0
        if expected is not None:
            xl_expected = openpyxl.load_workbook(filename=expected)
            pd_expected = pandas.ExcelFile(expected)
            opened.append(pd_expected)
            expected_names = list(pd_expected.sheet_names)
        else:
            xl_expected = pd_expected = expected_names = None
        books = _Books(result, expected, xl_result, xl_expected, pd_result, pd_expected,
                       list(pd_result.sheet_names), expected_names)

        passes: Any = True
        for rule in options["rules"]:
            kind = rule["type"]
            if kind not in _RULES:
                raise NotImplementedError(f"Unimplemented sheet check: {kind}")
            outcome = _RULES[kind](books, rule)
            books.last_metric, books.has_metric = outcome, True
            passes = passes and outcome
            if not passes:
                break
        return float(passes)
    finally:
        for book in opened:
            try:
                book.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


@metric("compare_csv", files=2)
def compare_csv(result: Any, expected: Any, **options: Any) -> float:
    """WAA `compare_csv` (metrics/table.py): 1.0 iff the two text files have the same lines
    (universal newlines); `strict` False (default True) strips each line, `ignore_case` lowers
    them. A None result gives 0; a missing file raises. Files are read as UTF-8."""
    if result is None:
        return 0.0
    with open(result, encoding="utf-8") as handle:
        ours = handle.read().splitlines()
    with open(expected, encoding="utf-8") as handle:
        gold = handle.read().splitlines()
    if not options.get("strict", True):
        ours, gold = [line.strip() for line in ours], [line.strip() for line in gold]
    if options.get("ignore_case", False):
        ours, gold = [line.lower() for line in ours], [line.lower() for line in gold]
    return 1.0 if ours == gold else 0.0


@metric("compare_conference_city_in_order", files=1)
def compare_conference_city_in_order(actual_city_list_path: Any, expected_city: Any) -> float:
    """WAA `compare_conference_city_in_order` (metrics/table.py): cells C2:C22 of the active
    sheet, in order, must each contain the expected string (or one of the expected strings when
    the entry is a list). Any failure while checking (a short expected list, an empty cell, an
    entry of another type) scores 0; a workbook that cannot be opened raises."""
    openpyxl, _ = _office("compare_conference_city_in_order")
    wanted = expected_city["expected"]
    sheet = openpyxl.load_workbook(actual_city_list_path).active
    cities = [cell.value for row in sheet["C2:C22"] for cell in row]
    try:
        for position, city in enumerate(cities):
            target = wanted[position]
            if isinstance(target, str):
                if target not in city:
                    return 0.0
            elif isinstance(target, list):
                if not any(option in city for option in target):
                    return 0.0
            else:
                raise TypeError("Expected city should be a string or a list of strings")
    except Exception:  # noqa: BLE001 - WAA's bare except
        return 0.0
    return 1.0
