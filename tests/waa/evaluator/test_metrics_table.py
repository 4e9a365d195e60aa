"""compare_table & co. on real xlsx files written at run time (openpyxl, or hand-written XML in
the shape LibreOffice saves: shared strings, cached formula values, fonts without a colour).

Every expected score below is WAA's own (checked against WAA's metrics/table.py), including its
strictness and quirks."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
from installed import require

require("openpyxl", "pandas")

import openpyxl  # noqa: E402
from openpyxl.chart import BarChart, LineChart, Reference  # noqa: E402
from openpyxl.formatting.rule import CellIsRule, FormulaRule  # noqa: E402
from openpyxl.styles import Font, PatternFill  # noqa: E402
from openpyxl.styles.differential import DifferentialStyle  # noqa: E402
from openpyxl.worksheet.datavalidation import DataValidation  # noqa: E402

import adapters.waa.evaluator.metrics_table  # noqa: E402,F401 - registers the metrics
from adapters.waa.evaluator.errors import MissingDependencyError  # noqa: E402
from adapters.waa.evaluator.metrics import METRICS  # noqa: E402
from adapters.waa.evaluator.metrics_table import (  # noqa: E402
    SUPPORTED_RULE_TYPES,
    match_value_to_rule,
    read_cell_value,
    unsupported_rule_options,
)

compare_table = METRICS["compare_table"]

# -- file builders ---------------------------------------------------------------------------------


def book(path: Path, sheets: dict[str, list[tuple[Any, ...]]], edit: Callable[[Any], None] | None = None) -> str:
    """An xlsx written by openpyxl: {sheet name: rows}; `edit(workbook)` may add more."""
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for row in rows:
            ws.append(row)
    if edit:
        edit(wb)
    wb.save(path)
    return str(path)


TABLE = [("Name", "Score"), ("ann", 1), ("bob", 2.5)]

_NS = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
_RNS = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
# Fonts: 0 = LibreOffice's default (no colour); 1 = bold white. Fills: 2 = solid blue as
# LibreOffice writes it (colour in fgColor, bgColor indexed 64); 3 = blue in bgColor too.
_STYLES = f"""<?xml version="1.0" encoding="UTF-8"?><styleSheet {_NS}>
<fonts count="2"><font><sz val="10"/><name val="Arial"/><family val="2"/></font>
<font><b val="true"/><sz val="10"/><color rgb="FFFFFFFF"/><name val="Arial"/><family val="2"/></font></fonts>
<fills count="4"><fill><patternFill patternType="none"/></fill><fill><patternFill patternType="gray125"/></fill>
<fill><patternFill patternType="solid"><fgColor rgb="FF0000FF"/><bgColor indexed="64"/></patternFill></fill>
<fill><patternFill patternType="solid"><fgColor rgb="FF0000FF"/><bgColor rgb="FF0000FF"/></patternFill></fill></fills>
<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>
<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>
<cellXfs count="4"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0"/>
<xf numFmtId="0" fontId="1" fillId="2" borderId="0" xfId="0" applyFont="true" applyFill="true"/>
<xf numFmtId="0" fontId="1" fillId="3" borderId="0" xfId="0" applyFont="true" applyFill="true"/>
<xf numFmtId="0" fontId="1" fillId="0" borderId="0" xfId="0" applyFont="true"/></cellXfs>
</styleSheet>"""


def raw_book(path: Path, sheets: dict[str, str], shared: list[str]) -> str:
    """A hand-written xlsx in LibreOffice's shape: {sheet name: <sheetData> inner XML}."""
    names = list(sheets)
    overrides = "".join(
        f'<Override PartName="/xl/worksheets/sheet{i}.xml" '
        'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
        for i in range(1, len(names) + 1)
    )
    files = {
        "[Content_Types].xml": (
            '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
            '<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>'
            '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
            f"{overrides}</Types>"
        ),
        "_rels/.rels": (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
            "</Relationships>"
        ),
        "xl/workbook.xml": (
            f'<?xml version="1.0" encoding="UTF-8"?><workbook {_NS} {_RNS}><sheets>'
            + "".join(f'<sheet name="{n}" sheetId="{i}" r:id="rId{i + 2}"/>' for i, n in enumerate(names, 1))
            + "</sheets></workbook>"
        ),
        "xl/_rels/workbook.xml.rels": (
            '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles" Target="styles.xml"/>'
            '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
            + "".join(
                f'<Relationship Id="rId{i + 2}" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" '
                f'Target="worksheets/sheet{i}.xml"/>'
                for i in range(1, len(names) + 1)
            )
            + "</Relationships>"
        ),
        "xl/styles.xml": _STYLES,
        "xl/sharedStrings.xml": (
            f'<?xml version="1.0" encoding="UTF-8"?><sst {_NS} count="{len(shared)}" uniqueCount="{len(shared)}">'
            + "".join(f"<si><t xml:space=\"preserve\">{s}</t></si>" for s in shared)
            + "</sst>"
        ),
    }
    for i, name in enumerate(names, 1):
        files[f"xl/worksheets/sheet{i}.xml"] = (
            f'<?xml version="1.0" encoding="UTF-8"?><worksheet {_NS} {_RNS}><sheetData>{sheets[name]}</sheetData></worksheet>'
        )
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return str(path)


# A LibreOffice-shaped sheet: A1 title (shared string 0, style 2 = white bold on blue, blue in
# bgColor too), A2 a number with a cached formula result, A3 a formula text result, A4 an
# inline string, A5 a boolean.
def demo_sheet(title_style: int = 2, title: str = '<c r="A1" s="{s}" t="s"><v>0</v></c>') -> str:
    return (
        '<row r="1">' + title.format(s=title_style) + "</row>"
        '<row r="2"><c r="A2" s="0"><f>1+1</f><v>2</v></c></row>'
        '<row r="3"><c r="A3" t="str"><f>"x"&amp;"y"</f><v> xy </v></c></row>'
        '<row r="4"><c r="A4" t="inlineStr"><is><t>inline</t></is></c></row>'
        '<row r="5"><c r="A5" t="b"><v>1</v></c></row>'
    )


SHARED = ["Demographic Profile", "other"]

# -- sheet_data / sheet_name -------------------------------------------------------------------------

DATA_RULE = [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]


@pytest.mark.parametrize(
    "ours, gold, rules, score",
    [
        (TABLE, TABLE, DATA_RULE, 1.0),
        (TABLE, [("Name", "Score"), ("ann", 1), ("bob", 2.6)], DATA_RULE, 0.0),
        # pandas' type inference turns the text "1" and the boolean TRUE in a numeric column
        # into the number 1, so sheet_data (WAA's too) cannot tell them apart ...
        ([("Name", "Score"), ("ann", "1"), ("bob", 2.5)], TABLE, DATA_RULE, 1.0),
        ([("Name", "Score"), ("ann", True), ("bob", 2.5)], TABLE, DATA_RULE, 1.0),
        # ... but text that is not a number stays text
        ([("Name", "Score"), ("ann", "one"), ("bob", 2.5)], TABLE, DATA_RULE, 0.0),
        # rounded to 4 decimals by default; `precision` changes it
        ([("Name", "Score"), ("ann", 1), ("bob", 2.50001)], TABLE, DATA_RULE, 1.0),
        ([("Name", "Score"), ("ann", 1), ("bob", 2.501)], TABLE, DATA_RULE, 0.0),
        ([("Name", "Score"), ("ann", 1), ("bob", 2.501)], TABLE, [{**DATA_RULE[0], "precision": 2}], 1.0),
        # the first row is the header: a different header is a different table
        ([("Name", "Points"), ("ann", 1), ("bob", 2.5)], TABLE, DATA_RULE, 0.0),
        # a whole-number float and an int are read alike (pandas turns 1.0 into 1)
        ([("Name", "Score"), ("ann", 1.0), ("bob", 2.5)], TABLE, DATA_RULE, 1.0),
        # an extra row fails
        (TABLE + [("cy", 3)], TABLE, DATA_RULE, 0.0),
    ],
)
def test_sheet_data(tmp_path, ours, gold, rules, score):
    result = book(tmp_path / "r.xlsx", {"Sheet1": ours})
    expected = book(tmp_path / "e.xlsx", {"Sheet1": gold})
    assert compare_table(result, expected, rules=rules) == score


def test_sheet_data_named_and_indexed_sheets(tmp_path):
    result = book(tmp_path / "r.xlsx", {"Sheet1": TABLE, "Sheet2": TABLE})
    expected = book(tmp_path / "e.xlsx", {"Sheet1": [("x",)], "Sheet2": TABLE})
    named = [{"type": "sheet_data", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2"}]
    assert compare_table(result, expected, rules=named) == 1.0
    # result sheet 0 against result sheet 1 (task 0cecd4f3 compares a copied sheet this way)
    assert compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": 1}]) == 1.0
    assert compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": "RI1", "sheet_idx1": "EI1"}]) == 1.0
    assert compare_table(result, expected, rules=DATA_RULE) == 0.0
    # a first sheet that does not exist fails the rule; a second one that does not exist raises
    assert compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": "RNNope", "sheet_idx1": "EI0"}]) == 0.0
    assert compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": 5, "sheet_idx1": "EI0"}]) == 0.0
    with pytest.raises(AttributeError):
        compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI7"}])
    with pytest.raises(ValueError):
        compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": "XX0", "sheet_idx1": "EI0"}])


def test_sheet_data_formula_without_cached_value(tmp_path):
    # openpyxl writes formulas without a cached result; pandas reads the cached value (NaN),
    # so only a file saved by a spreadsheet program (which caches results) can match.
    result = book(tmp_path / "r.xlsx", {"S": [("v",), ("=1+1",)]})
    expected = book(tmp_path / "e.xlsx", {"S": [("v",), (2,)]})
    assert compare_table(result, expected, rules=DATA_RULE) == 0.0
    cached = raw_book(tmp_path / "c.xlsx", {"S": '<row r="1"><c r="A1" t="s"><v>0</v></c></row>'
                                                 '<row r="2"><c r="A2"><f>1+1</f><v>2</v></c></row>'}, ["v"])
    assert compare_table(cached, expected, rules=DATA_RULE) == 1.0


def test_sheet_name(tmp_path):
    result = book(tmp_path / "r.xlsx", {"A": TABLE, "B": TABLE})
    assert compare_table(result, book(tmp_path / "e.xlsx", {"A": TABLE, "B": [("z",)]}), rules=[{"type": "sheet_name"}]) == 1.0
    assert compare_table(result, book(tmp_path / "e2.xlsx", {"B": TABLE, "A": TABLE}), rules=[{"type": "sheet_name"}]) == 0.0
    # rules run in order and stop at the first failure
    rules = [{"type": "sheet_name"}, {"type": "no_such_rule"}]
    assert compare_table(result, str(tmp_path / "e2.xlsx"), rules=rules) == 0.0
    with pytest.raises(NotImplementedError):
        compare_table(result, str(tmp_path / "e.xlsx"), rules=rules)


def test_unreadable_files(tmp_path):
    good = book(tmp_path / "g.xlsx", {"S": TABLE})
    junk = tmp_path / "junk.xlsx"
    junk.write_text("not a workbook")
    assert compare_table(None, good, rules=DATA_RULE) == 0.0
    assert compare_table(str(junk), good, rules=DATA_RULE) == 0.0
    assert compare_table(str(tmp_path / "missing.xlsx"), good, rules=DATA_RULE) == 0.0
    with pytest.raises(Exception):
        compare_table(good, str(junk), rules=DATA_RULE)
    with pytest.raises(KeyError):
        compare_table(good, good)  # no rules
    # without an expected file an "E" index has no book to read
    with pytest.raises(NotImplementedError):
        compare_table(good, rules=DATA_RULE)


# -- chart -------------------------------------------------------------------------------------------


def chart_book(path: Path, kind: type = BarChart, legend: str | None = "r", title: str | None = "Sales") -> str:
    def edit(wb):
        ws = wb["Sheet1"]
        chart = kind()
        chart.add_data(Reference(ws, min_col=2, min_row=1, max_row=3), titles_from_data=True)
        chart.set_categories(Reference(ws, min_col=1, min_row=2, max_row=3))
        if legend is None:
            chart.legend = None
        else:
            chart.legend.position = legend
        if title is not None:
            chart.title = title
        ws.add_chart(chart, "D2")

    return book(path, {"Sheet1": TABLE}, edit)


@pytest.mark.parametrize(
    "kwargs, props, score",
    [
        ({}, ["type"], 1.0),
        ({"kind": LineChart}, ["type"], 0.0),
        ({"legend": "b"}, ["type"], 1.0),
        ({"legend": "b"}, ["type", "legend"], 0.0),
        ({"legend": None}, ["legend"], 0.0),
        ({"title": "Other"}, ["type", "legend"], 1.0),
        ({"title": "Other"}, ["type", "legend", "title"], 0.0),
        ({"title": None}, ["title"], 0.0),
    ],
)
def test_chart(tmp_path, kwargs, props, score):
    result = chart_book(tmp_path / "r.xlsx", **kwargs)
    expected = chart_book(tmp_path / "e.xlsx")
    rules = [{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": props}]
    assert compare_table(result, expected, rules=rules) == score


def test_chart_missing_in_result(tmp_path):
    result = book(tmp_path / "r.xlsx", {"Sheet1": TABLE})
    rules = [{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": ["type"]}]
    assert compare_table(result, chart_book(tmp_path / "e.xlsx"), rules=rules) == 0.0


# -- pivot_table ---------------------------------------------------------------------------------------

PIVOT_PROPS = ["col_fields", "filter", "row_fields", "data_fields"]


def pivot_book(path: Path, row_fld: int = 0, page_fld: int | None = 1, subtotal: str = "sum",
               hidden: tuple[int, ...] = (), with_pivot: bool = True) -> str:
    from openpyxl.pivot.cache import CacheDefinition, CacheField, CacheSource, SharedItems, WorksheetSource
    from openpyxl.pivot.table import DataField, FieldItem, Location, PageField, PivotField, RowColField, TableDefinition

    def edit(wb):
        if not with_pivot:
            return
        cache = CacheDefinition(
            cacheSource=CacheSource(type="worksheet", worksheetSource=WorksheetSource(ref="A1:C5", sheet="Data")),
            cacheFields=[CacheField(name=n, sharedItems=SharedItems()) for n in ("Region", "Kind", "Amount")],
        )

        def items(hide=()):
            return [FieldItem(x=i, h=True if i in hide else None) for i in range(2)] + [FieldItem(t="default")]

        fields = []
        for i in range(3):
            kw: dict[str, Any] = {}
            if i == row_fld:
                kw = {"axis": "axisRow", "items": items()}
            elif i == page_fld:
                kw = {"axis": "axisPage", "items": items(hidden)}
            if i == 2:
                kw["dataField"] = True
            fields.append(PivotField(showAll=False, **kw))
        table = TableDefinition(
            name="PivotTable1", cacheId=1, dataCaption="Values",
            location=Location(ref="A3:B6", firstHeaderRow=1, firstDataRow=1, firstDataCol=1),
            pivotFields=fields, rowFields=[RowColField(x=row_fld)],
            dataFields=[DataField(name="Sum - Amount", fld=2, subtotal=subtotal)],
            pageFields=[PageField(fld=page_fld)] if page_fld is not None else [],
        )
        table.cache = cache
        wb["Pivot"].add_pivot(table)

    data = [("Region", "Kind", "Amount"), ("N", "a", 1), ("S", "b", 2), ("N", "b", 3), ("S", "a", 4)]
    return book(path, {"Data": data, "Pivot": []}, edit)


@pytest.mark.parametrize(
    "kwargs, score",
    [
        ({}, 1.0),
        ({"row_fld": 1, "page_fld": 0}, 0.0),
        ({"subtotal": "count"}, 0.0),
        ({"hidden": (1,)}, 0.0),  # a different filter selection
        ({"page_fld": None}, 0.0),
        ({"with_pivot": False}, 0.0),
    ],
)
def test_pivot_table(tmp_path, kwargs, score):
    result = pivot_book(tmp_path / "r.xlsx", **kwargs)
    expected = pivot_book(tmp_path / "e.xlsx")
    rules = [{"type": "pivot_table", "sheet_idx0": "RNPivot", "sheet_idx1": "ENPivot", "pivot_props": PIVOT_PROPS}]
    assert compare_table(result, expected, rules=rules) == score


def test_pivot_table_only_compares_listed_props(tmp_path):
    result = pivot_book(tmp_path / "r.xlsx", subtotal="count")
    rules = [{"type": "pivot_table", "sheet_idx0": 1, "sheet_idx1": "EI1", "pivot_props": ["row_fields", "filter"]}]
    assert compare_table(result, pivot_book(tmp_path / "e.xlsx"), rules=rules) == 1.0


# -- style -----------------------------------------------------------------------------------------------


def styled_book(path: Path, font: dict[str, Any] | None = None, fill: dict[str, Any] | None = None,
                cf: Any = None, value: Any = 7) -> str:
    def edit(wb):
        ws = wb["S"]
        if font is not None:
            ws["A2"].font = Font(**font)
        if fill is not None:
            ws["A2"].fill = PatternFill(**fill)
        if cf is not None:
            ws.conditional_formatting.add("A1:A3", cf)

    return book(path, {"S": [(1,), (value,), (3,)]}, edit)


def _style_rule(*props: str) -> list[dict[str, Any]]:
    return [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": list(props)}]


def test_style_font_color(tmp_path):
    red = styled_book(tmp_path / "red.xlsx", font={"color": "FFFF0000"})
    red2 = styled_book(tmp_path / "red2.xlsx", font={"color": "FFFF0000", "bold": True})
    blue = styled_book(tmp_path / "blue.xlsx", font={"color": "FF0000FF"})
    plain = styled_book(tmp_path / "plain.xlsx")
    assert compare_table(red, red2, rules=_style_rule("font_color")) == 1.0
    assert compare_table(red, red2, rules=_style_rule("font_color", "font_bold")) == 0.0
    assert compare_table(red, blue, rules=_style_rule("font_color")) == 0.0
    assert compare_table(plain, red, rules=_style_rule("font_color")) == 0.0
    # openpyxl's default font colour is a theme colour: it has no rgb, and every such colour
    # reads as the same placeholder, so theme colours all compare equal (a WAA quirk)
    themed = styled_book(tmp_path / "theme.xlsx", font={"color": openpyxl.styles.colors.Color(theme=5)})
    assert compare_table(plain, themed, rules=_style_rule("font_color")) == 1.0
    # a different used range is a different style map
    bigger = book(tmp_path / "big.xlsx", {"S": [(1,), (7,), (3,), (4,)]})
    assert compare_table(bigger, plain, rules=_style_rule("font_color")) == 0.0


def test_style_font_color_of_a_colourless_font_raises(tmp_path):
    # LibreOffice's default font has no colour element: WAA reads None.rgb and raises
    lo = raw_book(tmp_path / "lo.xlsx", {"S": '<row r="1"><c r="A1" s="0"><v>1</v></c></row>'}, [])
    with pytest.raises(AttributeError):
        compare_table(lo, lo, rules=_style_rule("font_color"))


def test_style_bgcolor_is_the_fill_background(tmp_path):
    # A solid fill's visible colour is its *foreground*; bgcolor reads the background colour,
    # which openpyxl leaves at 00000000: two different solid colours compare equal (WAA quirk).
    red = styled_book(tmp_path / "red.xlsx", fill={"fill_type": "solid", "fgColor": "FFFF0000"})
    green = styled_book(tmp_path / "green.xlsx", fill={"fill_type": "solid", "fgColor": "FF00FF00"})
    assert compare_table(red, green, rules=_style_rule("bgcolor")) == 1.0
    assert compare_table(red, green, rules=_style_rule("fgcolor")) == 0.0
    bg_red = styled_book(tmp_path / "bgred.xlsx", fill={"fill_type": "solid", "bgColor": "FFFF0000"})
    assert compare_table(bg_red, red, rules=_style_rule("bgcolor")) == 0.0


def test_style_conditional_formatting_expression(tmp_path):
    pytest.importorskip("formulas")
    dxf = DifferentialStyle(fill=PatternFill(bgColor="FFFF0000"))
    gold = styled_book(tmp_path / "gold.xlsx", cf=FormulaRule(formula=["A1>5"], fill=PatternFill(bgColor="FFFF0000")))
    # the active cell (A2 = 7) takes the format's bgColor; a static fill with that bgColor matches
    static = styled_book(tmp_path / "static.xlsx", fill={"fill_type": "solid", "bgColor": "FFFF0000"})
    assert compare_table(static, gold, rules=_style_rule("bgcolor")) == 1.0
    # the format's differential style has no font: reading font_bold from it raises in WAA
    with pytest.raises(AttributeError):
        compare_table(static, gold, rules=_style_rule("bgcolor", "font_bold"))
    plain = styled_book(tmp_path / "plain.xlsx")
    assert compare_table(plain, gold, rules=_style_rule("bgcolor")) == 0.0
    # when the condition holds for no cell the format changes nothing
    inactive = styled_book(tmp_path / "inactive.xlsx", cf=FormulaRule(formula=["A1>50"], fill=PatternFill(bgColor="FFFF0000")))
    assert compare_table(plain, inactive, rules=_style_rule("bgcolor")) == 1.0
    assert dxf.fill.bgColor.rgb == "FFFF0000"


def test_style_conditional_formatting_waa_failures(tmp_path):
    pytest.importorskip("formulas")
    plain = styled_book(tmp_path / "plain.xlsx")
    # only "expression" rules are implemented in WAA
    cell_is = styled_book(tmp_path / "cellis.xlsx", cf=CellIsRule(operator="greaterThan", formula=["5"], fill=PatternFill(bgColor="FFFF0000")))
    with pytest.raises(NotImplementedError):
        compare_table(plain, cell_is, rules=_style_rule("bgcolor"))
    # a single absolute cell becomes the invalid range "B1:" in WAA
    absolute = styled_book(tmp_path / "abs.xlsx", cf=FormulaRule(formula=["A1>$A$3"], fill=PatternFill(bgColor="FFFF0000")))
    with pytest.raises(ValueError):
        compare_table(plain, absolute, rules=_style_rule("bgcolor"))


# -- check_cell --------------------------------------------------------------------------------------------

CHECK = {
    "type": "check_cell", "sheet_idx": "RNSheet2", "coordinate": "A1",
    "props": {
        "bgcolor": {"method": "eq", "ref": "FF0000FF"},
        "font_color": {"method": "eq", "ref": "FFFFFFFF"},
        "font_bold": {"method": "eq", "ref": True},
        "value": {"method": "eq", "ref": "Demographic Profile"},
    },
}


@pytest.mark.parametrize(
    "style, title, score",
    [
        (2, '<c r="A1" s="{s}" t="s"><v>0</v></c>', 1.0),
        # the blue as LibreOffice writes a solid fill (in fgColor): bgcolor reads indexed 64
        (1, '<c r="A1" s="{s}" t="s"><v>0</v></c>', 0.0),
        (3, '<c r="A1" s="{s}" t="s"><v>0</v></c>', 0.0),  # no fill
        (2, '<c r="A1" s="{s}" t="s"><v>1</v></c>', 0.0),  # other text
        # an inline string has no value for WAA's reader
        (2, '<c r="A1" s="{s}" t="inlineStr"><is><t>Demographic Profile</t></is></c>', 0.0),
    ],
)
def test_check_cell(tmp_path, style, title, score):
    result = raw_book(tmp_path / "r.xlsx", {"Sheet1": "", "Sheet2": demo_sheet(style, title)}, SHARED)
    expected = book(tmp_path / "e.xlsx", {"Sheet1": [("x",)]})
    assert compare_table(result, expected, rules=[CHECK]) == score


def test_check_cell_value_reader_and_methods(tmp_path):
    path = raw_book(tmp_path / "r.xlsx", {"Sheet1": demo_sheet()}, SHARED)
    assert read_cell_value(path, "Sheet1", "A1") == "Demographic Profile"
    assert read_cell_value(path, "Sheet1", "A2") == 2.0  # numbers are floats
    assert read_cell_value(path, "Sheet1", "A3") == "xy"  # formula text, stripped
    assert read_cell_value(path, "Sheet1", "A4") is None  # inline string
    assert read_cell_value(path, "Sheet1", "A5") is None  # boolean
    assert read_cell_value(path, "Sheet1", "Z9") is None
    with pytest.raises(KeyError):
        read_cell_value(path, "Nope", "A1")

    def check(props):
        return compare_table(path, None, rules=[{"type": "check_cell", "sheet_idx": 0, "coordinate": "A2", "props": props}])

    assert check({"value": {"method": "eq", "ref": 2}}) == 1.0  # 2.0 == 2
    assert check({"value": {"method": "eq", "ref": "2"}}) == 0.0  # but not "2"
    assert check({"value": {"method": "approx:0.1", "ref": 2.05}}) == 1.0
    assert check({"value": {"method": "range.te", "ref": [1, 2]}}) == 1.0  # 1 < 2 <= 2
    assert check({"value": {"method": "gt", "ref": 2}}) == 0.0
    with pytest.raises(NotImplementedError):
        check({"value": {"method": "nope", "ref": 2}})
    # after the first failing property the later match rules are not evaluated (a broken one
    # does not raise), but every property is still read (an unknown one raises)
    assert check({"value": {"method": "eq", "ref": 3}, "font_bold": {"method": "nope", "ref": 1}}) == 0.0
    with pytest.raises(NotImplementedError):
        check({"value": {"method": "eq", "ref": 3}, "x": {"method": "eq", "ref": 1}})
    # a sheet that does not exist fails the rule
    assert compare_table(path, None, rules=[{**CHECK, "sheet_idx": "RNNope"}]) == 0.0


def test_match_value_to_rule():
    assert match_value_to_rule("Hello", {"method": "re.I", "ref": "^hello$"})
    assert not match_value_to_rule("Hello", {"method": "re", "ref": "^hello$"})
    assert match_value_to_rule('"a,b"', {"method": "str_set_eq", "ref": ["b", "a"]})
    assert not match_value_to_rule('"a,b"', {"method": "str_list_eq", "ref": ["b", "a"]})
    assert match_value_to_rule("x", {"method": "approx:1", "ref": 0}) is False
    assert match_value_to_rule(1, {"method": "eq", "ref": True})  # plain Python equality


# -- the rule types no calc task uses (WAA semantics all the same) ----------------------------------------


def test_freeze_zoom_dimensions(tmp_path):
    def edit(freeze=None, zoom=None, width=None, hidden_row=False):
        def apply(wb):
            ws = wb["S"]
            ws.freeze_panes = freeze
            ws.sheet_view.zoomScale = zoom
            if width:
                ws.column_dimensions["A"].width = width
            if hidden_row:
                ws.row_dimensions[2].hidden = True
        return apply

    base = book(tmp_path / "b.xlsx", {"S": TABLE}, edit(freeze="B2", zoom=150, width=20))
    other = book(tmp_path / "o.xlsx", {"S": TABLE}, edit(freeze="A2", width=30, hidden_row=True))
    same = book(tmp_path / "s.xlsx", {"S": TABLE}, edit(freeze="B2", zoom=150, width=20))
    freeze = [{"type": "freeze", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    assert compare_table(base, same, rules=freeze) == 1.0
    assert compare_table(base, other, rules=freeze) == 0.0
    assert compare_table(base, None, rules=[{"type": "zoom", "sheet_idx": 0, "method": "ge", "ref": 140}]) == 1.0
    # no zoom set reads as 100
    assert compare_table(other, None, rules=[{"type": "zoom", "sheet_idx": 0, "method": "eq", "ref": 100}]) == 1.0
    cols = [{"type": "col_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["width"]}]
    assert compare_table(base, same, rules=cols) == 1.0
    assert compare_table(base, other, rules=cols) == 0.0
    rows = [{"type": "row_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden"]}]
    assert compare_table(base, same, rules=rows) == 1.0
    assert compare_table(base, other, rules=rows) == 0.0


def test_data_validation_and_filter(tmp_path):
    def edit(formula, ref="A1:B3"):
        def apply(wb):
            ws = wb["S"]
            dv = DataValidation(type="list", formula1=formula)
            dv.add("B2:B9")
            ws.add_data_validation(dv)
            ws.auto_filter.ref = ref
        return apply

    path = book(tmp_path / "r.xlsx", {"S": TABLE}, edit('"a,b"'))
    dv_rule = {"type": "data_validation", "sheet_idx": 0,
               "dv_props": [{"type": {"method": "eq", "ref": "list"},
                             "formula1": {"method": "str_set_eq", "ref": ["b", "a"]},
                             "ranges": {"method": "spreadsheet_range", "ref": ["B2:B5", "B1:B20"]}}]}
    assert compare_table(path, None, rules=[dv_rule]) == 1.0
    other = book(tmp_path / "o.xlsx", {"S": TABLE}, edit('"a,c"', ref="A1:B2"))
    assert compare_table(other, None, rules=[dv_rule]) == 0.0
    flt = [{"type": "filter", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    assert compare_table(path, path, rules=flt) == 1.0
    assert compare_table(path, other, rules=flt) == 0.0


def test_sheet_print_and_sheet_fuzzy(tmp_path):
    result = raw_book(tmp_path / "r.xlsx", {"Sheet1": demo_sheet()}, SHARED)
    expected = raw_book(tmp_path / "e.xlsx", {"Sheet1": demo_sheet()}, ["demographic profile!", "other"])
    (tmp_path / "r-Sheet1.csv").write_text("a,b\r\n1,2\r\n\r\n", encoding="utf-8")
    (tmp_path / "e-Sheet1.csv").write_text("A,B\n1,2\n", encoding="utf-8")
    printed = {"type": "sheet_print", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    assert compare_table(result, expected, rules=[printed]) == 0.0
    assert compare_table(result, expected, rules=[{**printed, "ignore_case": True}]) == 1.0
    (tmp_path / "r-Sheet1.csv").unlink()
    assert compare_table(result, expected, rules=[printed]) == 0.0

    def fuzzy(**sub):
        return [{"type": "sheet_fuzzy", "sheet_idx0": 0, "sheet_idx1": "EI0", "rules": [{"range": ["A1:A3"], **sub}]}]

    assert compare_table(result, expected, rules=fuzzy(type="exact_match")) == 0.0
    assert compare_table(result, expected, rules=fuzzy(type="exact_match", ignore_case=True, ignore_chars="!")) == 1.0
    assert compare_table(result, expected, rules=fuzzy(type="included_by", ignore_case=True)) == 1.0
    assert compare_table(result, expected, rules=fuzzy(type="includes", ignore_case=True)) == 0.0
    pytest.importorskip("rapidfuzz")
    assert compare_table(result, expected, rules=fuzzy(type="fuzzy_match", threshold=90)) == 1.0 - 1.0  # "D" vs "d"
    assert compare_table(result, expected, rules=fuzzy(type="fuzzy_match", ignore_case=True)) == 1.0


def test_sparkline(tmp_path):
    sparks = (
        '</sheetData><extLst><ext uri="{05C60535-1F16-4fd2-B633-F4F36F0B64E0}" '
        'xmlns:x14="http://schemas.microsoft.com/office/spreadsheetml/2009/9/main">'
        '<x14:sparklineGroups xmlns:xm="http://schemas.microsoft.com/office/excel/2006/main">'
        "<x14:sparklineGroup><x14:sparklines><x14:sparkline><xm:f>Sheet1!A1:C1</xm:f><xm:sqref>D1</xm:sqref>"
        "</x14:sparkline></x14:sparklines></x14:sparklineGroup></x14:sparklineGroups></ext></extLst><sheetData>"
    )
    with_spark = raw_book(tmp_path / "s.xlsx", {"Sheet1": '<row r="1"><c r="A1"><v>1</v></c></row>' + sparks}, [])
    without = raw_book(tmp_path / "n.xlsx", {"Sheet1": '<row r="1"><c r="A1"><v>1</v></c></row>'}, [])
    rule = [{"type": "sparkline", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    assert compare_table(with_spark, with_spark, rules=rule) == 1.0
    assert compare_table(without, with_spark, rules=rule) == 0.0


# -- compare_csv / compare_conference_city_in_order ----------------------------------------------------


def test_compare_csv(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_bytes(b"x,1 \r\nY,2\r\n")
    b.write_text("x,1\ny,2\n", encoding="utf-8")
    csv = METRICS["compare_csv"]
    assert csv(None, str(b)) == 0.0
    assert csv(str(a), str(b)) == 0.0
    assert csv(str(a), str(b), strict=False) == 0.0
    assert csv(str(a), str(b), strict=False, ignore_case=True) == 1.0
    with pytest.raises(FileNotFoundError):
        csv(str(tmp_path / "nope.csv"), str(b))


def test_compare_conference_city_in_order(tmp_path):
    cities = [f"City {i}" for i in range(21)]
    path = book(tmp_path / "c.xlsx", {"S": [("h", "h", "h")] + [("", "", c) for c in cities]})
    check = METRICS["compare_conference_city_in_order"]
    assert check(path, {"expected": cities}) == 1.0
    assert check(path, {"expected": [["Nope", c] for c in cities]}) == 1.0
    assert check(path, {"expected": cities[:20]}) == 0.0  # too short: WAA's IndexError is a 0
    assert check(path, {"expected": ["Elsewhere"] + cities[1:]}) == 0.0


# -- packages and task coverage ------------------------------------------------------------------------


def test_missing_packages_raise_named_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "openpyxl", None)
    with pytest.raises(MissingDependencyError) as info:
        compare_table(str(tmp_path / "x.xlsx"), None, rules=[])
    assert info.value.extra == "office" and "openpyxl" in str(info.value)


def test_module_imports_without_office_packages():
    code = (
        "import sys\n"
        "for name in ('openpyxl', 'pandas', 'formulas', 'rapidfuzz'): sys.modules[name] = None\n"
        "import adapters.waa.evaluator.metrics_table as m\n"
        "from adapters.waa.evaluator.errors import MissingDependencyError\n"
        "try:\n    m.compare_table('x.xlsx', 'y.xlsx', rules=[])\n"
        "except MissingDependencyError as e:\n    print('extra', e.extra)\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "extra office"


TASKS = Path("/work/shared/waa-tasks")


def _compare_table_specs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(TASKS.glob("examples*/**/*.json")):
        spec = json.loads(path.read_text(encoding="utf-8")).get("evaluator", {})
        funcs = spec.get("func") if isinstance(spec.get("func"), list) else [spec.get("func")]
        options = spec.get("options") if isinstance(spec.get("options"), list) else [spec.get("options")] * len(funcs)
        for func, opts in zip(funcs, options):
            if func in ("compare_table", "compare_csv", "compare_conference_city_in_order"):
                found.append((f"{path.parent.name}/{path.name}", {"func": func, **(opts or {})}))
    return found


def test_every_task_rule_is_supported():
    if not TASKS.is_dir():
        pytest.skip(f"{TASKS} is not present")
    calc = sorted((TASKS / "examples" / "libreoffice_calc").glob("*.json"))
    assert calc, "no libreoffice_calc tasks found"
    specs = _compare_table_specs()
    assert len([name for name, _ in specs if name.startswith("libreoffice_calc/")]) >= len(calc)
    seen: set[str] = set()
    for name, spec in specs:
        assert spec["func"] in METRICS, name
        if spec["func"] == "compare_table":
            assert unsupported_rule_options(spec["rules"]) == [], name
            seen.update(rule["type"] for rule in spec["rules"])
    assert seen <= SUPPORTED_RULE_TYPES
    # what the 24 calc tasks use today
    assert {"sheet_name", "sheet_data", "chart", "style", "pivot_table", "check_cell"} <= seen


def test_unsupported_rule_options_reports():
    assert unsupported_rule_options([{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]) == []
    assert unsupported_rule_options([{"type": "bogus"}]) == ["rule type 'bogus'"]
    assert unsupported_rule_options([{"type": "chart", "chart_props": ["colour"]}]) == ["chart: chart_props 'colour'"]
    assert unsupported_rule_options([{"type": "check_cell", "props": {"value": {"method": "zz", "ref": 1}}}]) != []
    assert unsupported_rule_options("x") == ["rules is not a list"]
