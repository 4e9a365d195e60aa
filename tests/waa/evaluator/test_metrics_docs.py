"""Document metrics (metrics_docs.py) on real files built here, with WAA's exact scores.

Every .docx/.odt/.pdf is generated in tmp_path (python-docx, odfpy, PyMuPDF); tests that need
a package that is not installed are skipped, except the ones checking that a missing package
is reported as a MissingDependencyError.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import adapters.waa.evaluator.metrics_docs  # noqa: F401 - registers the metrics
from adapters.waa.evaluator import METRICS
from adapters.waa.evaluator.errors import MissingDependencyError

M = METRICS
REPO = Path(__file__).resolve().parents[3]
TASKS = Path("/work/shared/waa-tasks/examples")

DOC_METRICS = [
    "compare_docx_files",
    "compare_line_spacing",
    "evaluate_strike_through_last_paragraph",
    "check_tabstops",
    "is_first_line_centered",
    "compare_font_names",
    "compare_docx_tables",
    "check_italic_font_size_14",
    "compare_subscript_contains",
    "compare_highlighted_text",
    "find_default_font",
    "has_page_numbers_in_footers",
    "check_highlighted_words",
    "compare_pdfs",
]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_docx = pytest.mark.skipif(not _installed("docx"), reason="python-docx not installed")
needs_odf = pytest.mark.skipif(not _installed("odf"), reason="odfpy not installed")
needs_fuzz = pytest.mark.skipif(not _installed("rapidfuzz"), reason="rapidfuzz not installed")
needs_pdf = pytest.mark.skipif(
    not (_installed("pymupdf") and _installed("rapidfuzz")), reason="PyMuPDF/rapidfuzz not installed"
)
needs_docx_odf = pytest.mark.skipif(
    not (_installed("docx") and _installed("odf")), reason="python-docx/odfpy not installed"
)


# -- builders ---------------------------------------------------------------------------------


def docx_file(path: Path, paragraphs: list[Any] = (), build: Any = None) -> str:
    """A .docx whose body paragraphs are `paragraphs`: each a string (one run) or a list of
    (text, {font attribute: value}) runs. `build(document)` may add more."""
    from docx import Document

    document = Document()
    for spec in paragraphs:
        if isinstance(spec, str):
            document.add_paragraph(spec)
            continue
        paragraph = document.add_paragraph()
        for text, attributes in spec:
            run = paragraph.add_run(text)
            for name, value in attributes.items():
                setattr(run.font, name, value)
    if build is not None:
        build(document)
    document.save(str(path))
    return str(path)


def odt_file(path: Path, paragraphs: list[list[Any]], highlight: bool = False) -> str:
    """An .odt whose paragraphs are lists of parts: a string (text node), ("span", text) (a
    span, highlighted yellow when `highlight`) or ("s",) (a text:s space element)."""
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import P, S, Span

    document = OpenDocumentText()
    style = Style(name="T1", family="text")
    style.addElement(TextProperties(backgroundcolor="#ffff00" if highlight else "transparent"))
    document.automaticstyles.addElement(style)
    for parts in paragraphs:
        paragraph = P()
        for part in parts:
            if isinstance(part, str):
                paragraph.addText(part)
            elif part[0] == "span":
                paragraph.addElement(Span(stylename=style, text=part[1]))
            else:
                paragraph.addElement(S())
        document.text.addElement(paragraph)
    document.save(str(path))
    return str(path)


def pdf_file(path: Path, pages: list[str]) -> str:
    import pymupdf

    document = pymupdf.open()
    for text in pages:
        page = document.new_page()
        if text:
            page.insert_text((72, 72), text)
    document.save(str(path))
    document.close()
    return str(path)


def text_file(path: Path, content: str = "not an office file") -> str:
    path.write_text(content, encoding="utf-8")
    return str(path)


# -- registration and task coverage ----------------------------------------------------------


def test_all_document_metrics_registered():
    for name in DOC_METRICS:
        assert name in METRICS, name
        assert METRICS[name].__module__ == "adapters.waa.evaluator.metrics_docs"


def _task_specs() -> list[tuple[str, dict[str, Any]]]:
    if not TASKS.is_dir():
        pytest.skip(f"{TASKS} is absent")
    specs = []
    for folder in ("libreoffice_writer", "chrome"):
        for path in sorted((TASKS / folder).glob("*.json")):
            evaluator = json.loads(path.read_text(encoding="utf-8")).get("evaluator", {})
            specs.append((f"{folder}/{path.name}", evaluator))
    return specs


def test_writer_and_chrome_task_metrics_are_registered_and_accept_the_task_options():
    used: set[str] = set()
    for task, spec in _task_specs():
        funcs = spec["func"] if isinstance(spec["func"], list) else [spec["func"]]
        options = spec.get("options", {})
        options = options if isinstance(options, list) else [options] * len(funcs)
        expected = spec.get("expected")
        expected = expected if isinstance(expected, list) else [expected] * len(funcs)
        for index, name in enumerate(funcs):
            if name not in DOC_METRICS:
                continue
            used.add(name)
            assert name in METRICS, f"{task}: {name} not registered"
            # the engine calls fn(result, expected, **options) or fn(result, **options)
            args = ("result", "expected") if expected[index] else ("result",)
            inspect.signature(METRICS[name]).bind(*args, **(options[index] or {}))
    assert used == set(DOC_METRICS), set(DOC_METRICS) - used


def test_module_imports_without_optional_packages():
    code = (
        "import sys\n"
        "for name in ('docx', 'odf', 'pymupdf', 'fitz', 'rapidfuzz'): sys.modules[name] = None\n"
        "import adapters.waa.evaluator.metrics_docs\n"
        "from adapters.waa.evaluator import METRICS\n"
        "assert 'compare_pdfs' in METRICS\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("blocked", "call", "package"),
    [
        ("docx", lambda: M["compare_font_names"](None, {"font_name": "x"}), "python-docx"),
        ("docx", lambda: M["check_tabstops"]("a.docx", "b.docx"), "python-docx"),
        ("odf", lambda: M["compare_docx_files"]("a.odt", "b.odt"), "odfpy"),
        ("odf", lambda: M["check_highlighted_words"](None, None), "odfpy"),
        ("rapidfuzz", lambda: M["compare_docx_files"](None, None, content_only=True), "rapidfuzz"),
        ("rapidfuzz", lambda: M["compare_pdfs"](None, None), "rapidfuzz"),
        ("pymupdf", lambda: M["compare_pdfs"](None, None), "PyMuPDF"),
    ],
)
def test_missing_package_is_an_error_naming_it(monkeypatch, blocked, call, package):
    monkeypatch.setitem(sys.modules, blocked, None)
    if blocked == "pymupdf":
        monkeypatch.setitem(sys.modules, "fitz", None)
    with pytest.raises(MissingDependencyError) as caught:
        call()
    assert caught.value.packages == package
    assert caught.value.extra == "office"


@needs_docx_odf
def test_compare_docx_files_without_rapidfuzz_works_unless_content_only(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "rapidfuzz", None)
    a = docx_file(tmp_path / "a.docx", ["Same"])
    assert M["compare_docx_files"](a, a) == 1


def test_stdlib_only_metrics_need_no_optional_package(monkeypatch, tmp_path):
    for name in ("docx", "odf", "pymupdf", "fitz", "rapidfuzz"):
        monkeypatch.setitem(sys.modules, name, None)
    assert M["find_default_font"](None, {"font_name": "x"}) == 0
    assert M["compare_highlighted_text"](None, "b.docx") == 0


# -- compare_docx_files ----------------------------------------------------------------------


@needs_docx_odf
def test_compare_docx_files_default_ignores_blanks_and_paragraph_breaks(tmp_path):
    gold = docx_file(tmp_path / "gold.docx", ["Hello world", "Second line"])
    same = docx_file(tmp_path / "same.docx", ["Hello world", "Second line"])
    spaced = docx_file(tmp_path / "spaced.docx", ["  Hello   world", "", "Second\tline "])
    joined = docx_file(tmp_path / "joined.docx", ["Hello world Second line"])
    other = docx_file(tmp_path / "other.docx", ["Hello world", "Second lines"])
    cased = docx_file(tmp_path / "cased.docx", ["HELLO world", "Second line"])
    f = M["compare_docx_files"]
    assert f(same, gold) == 1
    assert f(spaced, gold) == 1
    assert f(joined, gold) == 1  # paragraph boundaries vanish in the joined text
    assert f(other, gold) == 0
    assert f(cased, gold) == 0
    assert f(cased, gold, ignore_case=True) == 1
    assert f(same, gold, some_unknown_option=True) == 1  # extra options are ignored


@needs_docx_odf
def test_compare_docx_files_paragraph_by_paragraph(tmp_path):
    gold = docx_file(tmp_path / "gold.docx", ["Hello world", "Second line"])
    joined = docx_file(tmp_path / "joined.docx", ["Hello world Second line"])
    spaced = docx_file(tmp_path / "spaced.docx", ["Hello  world", "Second line"])
    swapped = docx_file(tmp_path / "swapped.docx", ["Second line", "Hello world"])
    cased = docx_file(tmp_path / "cased.docx", ["hello WORLD", "second line"])
    f = M["compare_docx_files"]
    assert f(gold, gold, ignore_blanks=False) == 1
    assert f(joined, gold, ignore_blanks=False) == 0  # paragraph counts differ
    assert f(spaced, gold, ignore_blanks=False) == 0
    assert f(swapped, gold, ignore_blanks=False) == 0
    assert f(swapped, gold, ignore_blanks=False, ignore_order=True) == 1
    assert f(swapped, gold, ignore_order=True) == 1
    assert f(swapped, gold) == 0
    assert f(cased, gold, ignore_blanks=False, ignore_case=True) == 1


@needs_docx_odf
@needs_fuzz
def test_compare_docx_files_content_only_is_a_fraction(tmp_path):
    gold = docx_file(tmp_path / "gold.docx", ["Hello world"])
    near = docx_file(tmp_path / "near.docx", ["Hello  word"])
    upper = docx_file(tmp_path / "upper.docx", ["HELLO WORLD"])
    f = M["compare_docx_files"]
    # rapidfuzz ratio: 1 - indel distance / total length = 1 - 1/21
    assert f(near, gold, content_only=True) == pytest.approx(20 / 21)
    assert f(gold, gold, content_only=True) == 1.0
    assert f(upper, gold, content_only=True, ignore_case=True) == 1.0
    assert f(upper, gold, content_only=True) == pytest.approx(1 - 18 / 22)  # only "H" and " " shared


@needs_docx_odf
def test_compare_docx_files_odd_inputs(tmp_path):
    gold = docx_file(tmp_path / "gold.docx", ["Hello"])
    f = M["compare_docx_files"]
    assert f(None, gold) == 0
    assert f(gold, None) == 0
    assert f("", gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0
    assert f(text_file(tmp_path / "broken.docx"), gold) == 0
    upper = tmp_path / "UPPER.DOCX"
    upper.write_bytes(Path(gold).read_bytes())
    assert f(str(upper), gold) == 0  # the suffix test is case-sensitive
    odt = odt_file(tmp_path / "gold.odt", [["Hello"]])
    assert f(odt, gold) == 0  # mixed types
    assert f(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")) == 0
    with pytest.raises(AttributeError):  # WAA calls str.endswith on the path
        f(Path(gold), gold)


@needs_docx_odf
def test_compare_docx_files_odt(tmp_path):
    gold = odt_file(tmp_path / "gold.odt", [["Call the candidate"], ["Ask questions"]])
    with_span = odt_file(tmp_path / "span.odt", [["Call ", ("span", "the candidate")], ["Ask questions"]])
    other = odt_file(tmp_path / "other.odt", [["Call the recruiter"], ["Ask questions"]])
    # WAA reads only direct text and span text: a text:s space element is dropped
    spaced = odt_file(tmp_path / "spaced.odt", [["Call", ("s",), "the candidate"], ["Ask questions"]])
    squeezed = odt_file(tmp_path / "squeezed.odt", [["Callthe candidate"], ["Ask questions"]])
    f = M["compare_docx_files"]
    assert f(with_span, gold) == 1
    assert f(with_span, gold, ignore_blanks=False) == 1
    assert f(other, gold) == 0
    assert f(spaced, gold) == 0
    assert f(spaced, squeezed) == 1
    assert f(str(tmp_path / "missing.odt"), gold) == 0
    assert f(text_file(tmp_path / "broken.odt"), gold) == 0


# -- compare_line_spacing ----------------------------------------------------------------------


@needs_docx_odf
def test_compare_line_spacing(tmp_path):
    def spaced(name: str, spacings: list[Any], texts: list[str] = ("One", "Two")) -> str:
        def build(document: Any) -> None:
            for text, spacing in zip(texts, spacings):
                paragraph = document.add_paragraph(text)
                if spacing is not None:
                    paragraph.paragraph_format.line_spacing = spacing

        return docx_file(tmp_path / name, build=build)

    gold = spaced("gold.docx", [1.5, 2.0])
    f = M["compare_line_spacing"]
    assert f(spaced("same.docx", [1.5, 2.0]), gold) == 1
    assert f(spaced("diff.docx", [1.5, 1.0]), gold) == 0
    assert f(spaced("unset.docx", [1.5, None]), gold) == 0
    assert f(spaced("text.docx", [1.5, 2.0], ["One", "Three"]), gold) == 0
    # same text once blanks are collapsed, but one more (empty) paragraph
    assert f(spaced("extra.docx", [1.5, 2.0, 2.0], ["One", "Two", ""]), gold) == 0
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0
    with pytest.raises(TypeError):  # WAA's function takes no options
        f(gold, gold, ignore_blanks=False)


# -- evaluate_strike_through_last_paragraph ----------------------------------------------------


@needs_docx_odf
def test_evaluate_strike_through_last_paragraph(tmp_path):
    strike = {"strike": True}
    gold = docx_file(tmp_path / "gold.docx", ["Intro", "Old text here"])
    done = docx_file(tmp_path / "done.docx", ["Intro", [("Old text ", strike), ("here", strike)]])
    half = docx_file(tmp_path / "half.docx", ["Intro", [("Old text ", strike), ("here", {})]])
    first = docx_file(tmp_path / "first.docx", [[("Intro", strike)], "Old text here"])
    edited = docx_file(tmp_path / "edited.docx", ["Intro", [("Old text", strike)]])
    f = M["evaluate_strike_through_last_paragraph"]
    assert f(done, gold) == 1
    assert f(half, gold) == 0
    assert f(first, gold) == 0
    assert f(edited, gold) == 0  # compare_docx_files fails first
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0


@needs_docx_odf
def test_evaluate_strike_through_odd_documents(tmp_path):
    f = M["evaluate_strike_through_last_paragraph"]
    empty_last = docx_file(tmp_path / "empty_last.docx", ["Intro", [("", {})]])
    no_runs = docx_file(tmp_path / "no_runs.docx", ["Intro", []])
    assert f(no_runs, empty_last) == 1  # a last paragraph without runs passes
    empty = docx_file(tmp_path / "empty.docx", [])
    with pytest.raises(IndexError):  # no paragraph at all: WAA indexes paragraphs[-1]
        f(empty, empty)


# -- check_tabstops ----------------------------------------------------------------------------


def _tabbed(tmp_path: Path, name: str, paragraphs: list[tuple[str, list[tuple[float, str]]]]) -> str:
    """Paragraphs of (text, [(position in inches, alignment name)])."""
    from docx.enum.text import WD_TAB_ALIGNMENT
    from docx.shared import Inches

    def build(document: Any) -> None:
        for text, stops in paragraphs:
            paragraph = document.add_paragraph(text)
            for inches, alignment in stops:
                paragraph.paragraph_format.tab_stops.add_tab_stop(Inches(inches), getattr(WD_TAB_ALIGNMENT, alignment))

    return docx_file(tmp_path / name, build=build)


@needs_docx
def test_check_tabstops_scores(tmp_path):
    # python-docx's default page: 8.5in wide with 1.25in margins, so the text is 6in wide
    gold = _tabbed(tmp_path, "gold.docx", [("Alpha beta gamma\tone", [(2, "LEFT")]), ("Delta\ttwo", [(3, "RIGHT")])])
    f = M["check_tabstops"]
    same = _tabbed(tmp_path, "same.docx", [("Alpha beta gamma\tone", [(2, "LEFT")]), ("Other\ttext", [(3, "RIGHT")])])
    assert f(same, gold) == 1.0
    shifted = _tabbed(tmp_path, "shifted.docx", [("Alpha\tone", [(2.5, "LEFT")]), ("Delta\ttwo", [(3, "RIGHT")])])
    assert f(shifted, gold) == pytest.approx(1 - (0.5 / 6) / 2)  # 23/24
    both = _tabbed(tmp_path, "both.docx", [("Alpha\tone", [(1, "LEFT")]), ("Delta\ttwo", [(4.5, "RIGHT")])])
    assert f(both, gold) == pytest.approx(1 - (1 / 6 + 1.5 / 6) / 2)
    aligned = _tabbed(tmp_path, "aligned.docx", [("Alpha\tone", [(2, "CENTER")]), ("Delta\ttwo", [(3, "RIGHT")])])
    assert f(aligned, gold) == 0.0
    more = _tabbed(tmp_path, "more.docx", [("Alpha\tone", [(2, "LEFT"), (4, "LEFT")]), ("Delta\ttwo", [(3, "RIGHT")])])
    assert f(more, gold) == 0.0
    fewer = _tabbed(tmp_path, "fewer.docx", [("Alpha\tone", [(2, "LEFT")])])
    assert f(fewer, gold) == 0.0
    # blank paragraphs do not count, cleared stops and left stops at 0 are ignored
    padded = _tabbed(
        tmp_path,
        "padded.docx",
        [(" ", []), ("Alpha\tone", [(2, "LEFT"), (1, "CLEAR"), (0, "LEFT")]), ("", []), ("Delta\ttwo", [(3, "RIGHT")])],
    )
    assert f(padded, gold) == 1.0
    # far-off stops make WAA's score negative (the engine reports it as an evaluation error)
    far = _tabbed(tmp_path, "far.docx", [("Alpha\tone", [(20, "LEFT")]), ("Delta\ttwo", [(3, "RIGHT")])])
    assert f(far, gold) == pytest.approx(1 - (18 / 6) / 2)  # -0.5


@needs_docx
def test_check_tabstops_word_number_option(tmp_path):
    f = M["check_tabstops"]
    gold = _tabbed(tmp_path, "gold.docx", [("One two three\tx", [(2, "LEFT")]), ("Four five six\ty", [(2, "LEFT")])])
    good = _tabbed(tmp_path, "good.docx", [("a b  c\tx y", [(2, "LEFT")]), ("d e f\ty", [(2, "LEFT")])])
    bad = _tabbed(tmp_path, "bad.docx", [("a b c\tx", [(2, "LEFT")]), ("d e\tf y", [(2, "LEFT")])])
    options = {"word_number_split_by_tabstop": 3, "index": 0}  # as in task 0a0faba3
    assert f(good, gold, **options) == 1.0
    assert f(bad, gold, **options) == 0.0
    assert f(bad, gold) == 1.0  # without the option only the stops count
    assert f(good, gold, word_number_split_by_tabstop=2, index=1) == 0.0  # "x y" then "y"
    assert f(good, gold, word_number_split_by_tabstop="3") == 0.0  # 3 != "3"
    assert f(good, gold, word_number_split_by_tabstop=3, some_other_option=1) == 1.0
    with pytest.raises(IndexError):  # no third tab-separated part
        f(good, gold, word_number_split_by_tabstop=1, index=2)


@needs_docx
def test_check_tabstops_odd_inputs(tmp_path):
    f = M["check_tabstops"]
    gold = _tabbed(tmp_path, "gold.docx", [("One\tx", [(2, "LEFT")])])
    assert f(None, gold) == 0.0
    assert f(gold, "") == 0.0
    assert f(str(tmp_path / "missing.docx"), gold) == 0.0
    assert f(text_file(tmp_path / "broken.docx"), gold) == 0.0
    blank = docx_file(tmp_path / "blank.docx", ["", "  "])
    with pytest.raises(ZeroDivisionError):  # no non-blank paragraph on either side
        f(blank, blank)


# -- is_first_line_centered --------------------------------------------------------------------


@needs_docx
def test_is_first_line_centered(tmp_path):
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    def aligned(name: str, alignment: Any) -> str:
        def build(document: Any) -> None:
            document.add_paragraph("Title").alignment = alignment
            document.add_paragraph("Body")

        return docx_file(tmp_path / name, build=build)

    f = M["is_first_line_centered"]
    assert f(aligned("center.docx", WD_PARAGRAPH_ALIGNMENT.CENTER)) == 1
    assert f(aligned("left.docx", WD_PARAGRAPH_ALIGNMENT.LEFT)) == 0
    assert f(aligned("unset.docx", None)) == 0
    assert f(None) == 0
    assert f(str(tmp_path / "missing.docx")) == 0
    with pytest.raises(IndexError):
        f(docx_file(tmp_path / "empty.docx", []))
    with pytest.raises(TypeError):
        f(aligned("x.docx", None), {"unexpected": "argument"})


# -- compare_font_names ------------------------------------------------------------------------


@needs_docx
def test_compare_font_names(tmp_path):
    rules = {"font_name": "Times New Roman"}
    tnr = {"name": "Times New Roman"}
    f = M["compare_font_names"]
    assert f(docx_file(tmp_path / "ok.docx", [[("A", tnr)], [("B", tnr), ("C", tnr)]]), rules) == 1
    assert f(docx_file(tmp_path / "arial.docx", [[("A", tnr)], [("B", {"name": "Arial"})]]), rules) == 0
    assert f(docx_file(tmp_path / "unset.docx", [[("A", tnr)], "B"]), rules) == 0  # font.name None
    assert f(docx_file(tmp_path / "empty.docx", []), rules) == 1  # no run to fail
    assert f(None, rules) == 0
    assert f(str(tmp_path / "missing.docx"), {}) == 0  # rules never read
    with pytest.raises(KeyError):
        f(docx_file(tmp_path / "x.docx", ["A"]), {})


# -- compare_docx_tables -----------------------------------------------------------------------


@needs_docx
def test_compare_docx_tables(tmp_path):
    def tables(name: str, *grids: list[list[str]]) -> str:
        def build(document: Any) -> None:
            for grid in grids:
                table = document.add_table(rows=len(grid), cols=len(grid[0]))
                for i, row in enumerate(grid):
                    for j, text in enumerate(row):
                        table.cell(i, j).text = text

        return docx_file(tmp_path / name, ["Intro"], build)

    gold = tables("gold.docx", [["a", "b"], ["c", "d"]])
    f = M["compare_docx_tables"]
    assert f(tables("same.docx", [[" a ", "b"], ["c", "d\n"]]), gold) == 1  # cell text is stripped
    assert f(tables("cell.docx", [["a", "b"], ["c", "e"]]), gold) == 0
    assert f(tables("rows.docx", [["a", "b"], ["c", "d"], ["", ""]]), gold) == 0
    assert f(tables("cols.docx", [["a", "b", ""], ["c", "d", ""]]), gold) == 0
    assert f(tables("two.docx", [["a", "b"], ["c", "d"]], [["x"]]), gold) == 0
    assert f(docx_file(tmp_path / "none.docx", ["Intro"]), docx_file(tmp_path / "none2.docx", ["Other"])) == 1
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0


# -- check_italic_font_size_14 -----------------------------------------------------------------


@needs_docx_odf
def test_check_italic_font_size_14(tmp_path):
    from docx.shared import Pt

    gold = docx_file(tmp_path / "gold.docx", ["Plain and italic words"])
    f = M["check_italic_font_size_14"]

    def doc(name: str, italic: dict[str, Any], plain: dict[str, Any] = {}) -> str:  # noqa: B006
        return docx_file(tmp_path / name, [[("Plain and ", plain), ("italic words", italic)]])

    assert f(doc("ok.docx", {"italic": True, "size": Pt(14)}), gold) == 1
    assert f(doc("twelve.docx", {"italic": True, "size": Pt(12)}), gold) == 0
    assert f(doc("nosize.docx", {"italic": True}), gold) == 0
    assert f(doc("plain.docx", {}, {"size": Pt(9)}), gold) == 1  # only italic runs are checked
    assert f(docx_file(tmp_path / "text.docx", [[("Other", {"italic": True, "size": Pt(14)})]]), gold) == 0
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0


# -- compare_subscript_contains ----------------------------------------------------------------


@needs_docx
def test_compare_subscript_contains(tmp_path):
    sub = {"subscript": True}
    gold = docx_file(tmp_path / "gold.docx", ["Water", [("H", {}), ("2", sub), ("O", {})]])
    f = M["compare_subscript_contains"]
    assert f(docx_file(tmp_path / "ok.docx", ["Water", [("H", {}), ("2", sub), ("O", {})]]), gold) == 1
    assert f(docx_file(tmp_path / "plain.docx", ["Water", "H2O"]), gold) == 0
    # a subscript at another run position does not pair with the gold one
    assert f(docx_file(tmp_path / "moved.docx", ["Water", [("H", {}), ("2", {}), ("O", sub)]]), gold) == 0
    # any pair of subscript runs is enough, whatever the rest of the text
    assert f(docx_file(tmp_path / "other.docx", ["Fire", [("X", {}), ("9", sub)]]), gold) == 1
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.docx"), gold) == 0


# -- compare_highlighted_text ------------------------------------------------------------------


def _highlighted(tmp_path: Path, name: str, runs: list[tuple[str, str | None]]) -> str:
    """One paragraph of runs (text, highlight value or None)."""
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    def build(document: Any) -> None:
        paragraph = document.add_paragraph()
        for text, value in runs:
            run = paragraph.add_run(text)
            if value is not None:
                mark = OxmlElement("w:highlight")
                mark.set(qn("w:val"), value)
                run._r.get_or_add_rPr().append(mark)

    return docx_file(tmp_path / name, build=build)


@needs_docx
def test_compare_highlighted_text(tmp_path):
    gold = _highlighted(tmp_path, "gold.docx", [("Read ", None), ("the abstract", "yellow"), (" first", None)])
    f = M["compare_highlighted_text"]
    ok = _highlighted(tmp_path, "ok.docx", [("Read ", None), ("the abstract", "green"), (" first", None)])
    assert f(ok, gold) == 1
    assert f(_highlighted(tmp_path, "none.docx", [("Read the abstract first", None)]), gold) == 0
    assert f(_highlighted(tmp_path, "more.docx", [("Read ", "yellow"), ("the abstract", "yellow")]), gold) == 0
    # the texts are compared as sets; a 'none' highlight does not count
    twice = _highlighted(tmp_path, "twice.docx", [("the abstract", "yellow"), ("x", "none"), ("the abstract", "cyan")])
    assert f(twice, gold) == 1
    plain = _highlighted(tmp_path, "plain.docx", [("Nothing", None)])
    assert f(plain, _highlighted(tmp_path, "plain2.docx", [("Other", "none")])) == 1
    assert f(None, gold) == 0
    assert f(gold, "") == 0


@needs_docx
def test_compare_highlighted_text_raises_like_waa(tmp_path):
    gold = _highlighted(tmp_path, "gold.docx", [("x", "yellow")])
    f = M["compare_highlighted_text"]
    with pytest.raises(FileNotFoundError):
        f(str(tmp_path / "missing.docx"), gold)
    with pytest.raises(zipfile.BadZipFile):
        f(text_file(tmp_path / "broken.docx"), gold)
    nodoc = tmp_path / "nodoc.docx"
    with zipfile.ZipFile(nodoc, "w") as package:
        package.writestr("other.xml", "<a/>")
    with pytest.raises(KeyError):
        f(str(nodoc), gold)


# -- find_default_font -------------------------------------------------------------------------


def _xcu(tmp_path: Path, fonts: list[str | None], name: str = "registrymodifications.xcu") -> str:
    items = "".join(
        '<item oor:path="/org.openoffice.Office.Writer/DefaultFont">'
        f'<prop oor:name="Standard" oor:op="fuse">{"<value/>" if font is None else f"<value>{font}</value>"}</prop>'
        "</item>"
        for font in fonts
    )
    text = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
        'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
        '<item oor:path="/org.openoffice.Office.Common/Misc">'
        '<prop oor:name="Standard"><value>Arial</value></prop></item>'
        f"{items}</oor:items>"
    )
    return text_file(tmp_path / name, text)


def test_find_default_font(tmp_path):
    rules = {"font_name": "Times New Roman"}
    f = M["find_default_font"]
    assert f(_xcu(tmp_path, ["Times New Roman"]), rules) == 1
    assert f(_xcu(tmp_path, ["Liberation Serif"]), rules) == 0
    assert f(_xcu(tmp_path, []), rules) == 0  # only the other item's 'Standard' prop
    assert f(_xcu(tmp_path, ["Times New Roman", "Arial"]), rules) == 0  # the last value wins
    assert f(_xcu(tmp_path, ["Arial", "Times New Roman"]), rules) == 1
    assert f(_xcu(tmp_path, [None]), {"font_name": None}) == 1  # <value/> has text None
    assert f(None, rules) == 0
    assert f("", {"font_name": None}) == 0
    assert f(str(tmp_path / "missing.xcu"), rules) == 0
    assert f(text_file(tmp_path / "bad.xcu", "<oor:items"), rules) == 0
    # an unreadable file means "no default font", which equals a font_name of None
    assert f(str(tmp_path / "missing.xcu"), {"font_name": None}) == 1
    with pytest.raises(KeyError):  # rules are read before the path is checked
        f(None, {})


# -- has_page_numbers_in_footers ---------------------------------------------------------------


def _footer_run(paragraph: Any, kind: str, text: str = "") -> None:
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    run = paragraph.add_run()
    if kind == "text":
        run.text = text
    elif kind == "instr":
        element = OxmlElement("w:instrText")
        element.text = text
        run._r.append(element)
    else:
        element = OxmlElement("w:fldChar")
        element.set(qn("w:fldCharType"), kind)
        run._r.append(element)


@needs_docx
def test_has_page_numbers_in_footers(tmp_path):
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    f = M["has_page_numbers_in_footers"]

    def footers(name: str, *texts: Any) -> str:
        def build(document: Any) -> None:
            for index, text in enumerate(texts):
                section = document.sections[0] if index == 0 else document.add_section()
                footer = section.footer
                footer.is_linked_to_previous = False
                if callable(text):
                    text(footer.paragraphs[0])
                elif isinstance(text, list):
                    footer.paragraphs[0].text = text[0]
                    for more in text[1:]:
                        footer.add_paragraph(more)
                else:
                    footer.paragraphs[0].text = text

        return docx_file(tmp_path / name, ["Body"], build)

    def page_field(paragraph: Any) -> None:  # how LibreOffice writes a PAGE field
        _footer_run(paragraph, "text", "Page ")
        _footer_run(paragraph, "begin")
        _footer_run(paragraph, "instr", " PAGE ")
        _footer_run(paragraph, "separate")
        _footer_run(paragraph, "text", "1")
        _footer_run(paragraph, "end")

    def simple_field(paragraph: Any) -> None:  # w:fldSimple: python-docx's text skips it
        field = OxmlElement("w:fldSimple")
        field.set(qn("w:instr"), "PAGE")
        run = OxmlElement("w:r")
        t = OxmlElement("w:t")
        t.text = "1"
        run.append(t)
        field.append(run)
        paragraph._p.append(field)

    assert f(footers("field.docx", page_field)) == 1
    assert f(footers("digit.docx", "Page 1", "2")) == 1
    assert f(footers("words.docx", "Page one")) == 0
    assert f(footers("second.docx", "Page 1", "no number")) == 0  # every section needs one
    assert f(footers("later.docx", ["Page", "1"])) == 0  # only the first footer paragraph counts
    assert f(footers("simple.docx", simple_field)) == 0
    assert f(footers("superscript.docx", "Page \u00b2")) == 1  # str.isdigit accepts '²'
    assert f(docx_file(tmp_path / "nofooter.docx", ["Body"])) == 0
    assert f(None) == 0
    assert f(str(tmp_path / "missing.docx")) == 0


# -- check_highlighted_words -------------------------------------------------------------------


@needs_docx_odf
def test_check_highlighted_words(tmp_path):
    text = [["Call ", ("span", "the candidate"), " today"]]
    gold = odt_file(tmp_path / "gold.odt", [["Call the candidate today"]])
    f = M["check_highlighted_words"]
    # 1 means the yellow highlighting is gone
    assert f(odt_file(tmp_path / "clean.odt", text, highlight=False), gold) == 1
    assert f(odt_file(tmp_path / "yellow.odt", text, highlight=True), gold) == 0
    assert f(odt_file(tmp_path / "edited.odt", [["Call ", ("span", "them")]], highlight=False), gold) == 0
    assert f(None, gold) == 0
    assert f(str(tmp_path / "missing.odt"), gold) == 0  # compare_docx_files fails first
    docx_gold = docx_file(tmp_path / "gold.docx", ["Same"])
    with pytest.raises(KeyError):  # a .docx pair passes compare_docx_files, then odfpy's load fails
        f(docx_gold, docx_gold)


# -- compare_pdfs ------------------------------------------------------------------------------


@needs_pdf
def test_compare_pdfs(tmp_path):
    gold = pdf_file(tmp_path / "gold.pdf", ["Hello world"])
    f = M["compare_pdfs"]
    assert f(pdf_file(tmp_path / "same.pdf", ["Hello world"]), gold) == 1.0
    assert f(pdf_file(tmp_path / "near.pdf", ["Hello word"]), gold) == pytest.approx(20 / 21)
    # pages are concatenated: "Hello\nworld" against "Hello world"
    assert f(pdf_file(tmp_path / "pages.pdf", ["Hello", "world"]), gold) == pytest.approx(10 / 11)
    assert f(str(tmp_path / "missing.pdf"), gold) == 0.0
    assert f(text_file(tmp_path / "broken.pdf"), gold) == 0.0
    assert f(None, gold) == 0.0  # None opens as an empty PDF: '' against the gold text


@needs_pdf
def test_compare_pdfs_odd_inputs(tmp_path):
    gold = pdf_file(tmp_path / "gold.pdf", ["Hello world"])
    blank = pdf_file(tmp_path / "blank.pdf", [""])
    f = M["compare_pdfs"]
    assert f(None, blank) == 1.0  # '' == '': WAA has no None check
    assert f("", blank) == 1.0
    same = pdf_file(tmp_path / "same.pdf", ["Hello world"])
    assert f([same, str(tmp_path / "missing.pdf")], [gold, gold]) == 0.5  # a failed pair adds 0
    assert f([same], [gold, gold]) == 0.5  # zip stops early, the mean divides by 2
    assert f(same, [gold, gold]) == 0.0  # a string is zipped character by character
    assert f([same, same], gold) == 0.0  # both wrapped: opening a list fails
    with pytest.raises(ZeroDivisionError):
        f([], [])
    with pytest.raises(TypeError):
        f(None, [gold])  # zip(None, ...)


# -- through the engine ------------------------------------------------------------------------


@needs_docx_odf
def test_engine_scores_writer_multi_metric_task(vm, evaluate, tmp_path):
    """The shape of writer task 0b17a146 (compare_docx_files and compare_subscript_contains),
    with the gold file served from the offline cloud_file cache."""
    from adapters.waa.evaluator.getters import cloud_cache_path

    url = "https://example.invalid/H2O_Factsheet_WA_Gold.docx"
    downloads = tmp_path / "downloads"
    cached = cloud_cache_path(downloads, url, "H2O_Factsheet_WA_Gold.docx")
    cached.parent.mkdir(parents=True)
    docx_file(cached, ["Water", [("H", {}), ("2", {"subscript": True}), ("O", {})]])  # the gold
    vm_path = r"C:\Users\Docker\Downloads\H2O_Factsheet_WA.docx"
    result = {"type": "vm_file", "path": vm_path, "dest": "H2O_Factsheet_WA.docx"}
    expected = {"type": "cloud_file", "path": url, "dest": "H2O_Factsheet_WA_Gold.docx"}
    spec = {
        "func": ["compare_docx_files", "compare_subscript_contains"],
        "result": [result, result],
        "expected": [expected, expected],
    }

    water = ["Water", [("H", {}), ("2", {"subscript": True}), ("O", {})]]
    vm.files[vm_path] = Path(docx_file(tmp_path / "ok.docx", water)).read_bytes()
    out = evaluate(spec, offline=True, download_dir=downloads, cache_dir=tmp_path / "a1")
    assert (out.kind, out.score) == ("scored", 1.0), out.reason

    vm.files[vm_path] = Path(docx_file(tmp_path / "plain.docx", ["Water", "H2O"])).read_bytes()
    out = evaluate(spec, offline=True, download_dir=downloads, cache_dir=tmp_path / "a2")
    assert (out.kind, out.score) == ("scored", 0.0), out.reason

    out = evaluate({"func": "is_first_line_centered", "result": result}, cache_dir=tmp_path / "a3")
    assert (out.kind, out.score) == ("scored", 0.0), out.reason

    vm.files[vm_path] = Path(docx_file(tmp_path / "empty.docx", [])).read_bytes()
    out = evaluate({"func": "is_first_line_centered", "result": result}, cache_dir=tmp_path / "a4")
    assert out.kind == "evaluation_error" and "IndexError" in out.reason
