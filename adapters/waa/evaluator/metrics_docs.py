"""Document metrics: LibreOffice Writer files (.docx, .odt), Writer's settings file and PDFs.

Each metric mirrors the WAA function of the same name (`docs.py`, or `chrome.py` for
`compare_pdfs`) on every input, odd ones included, and registers under that name in
`metrics.METRICS` when this module is imported. Scores are WAA's: mostly 0/1, but
`compare_docx_files` with `content_only`, `check_tabstops` and `compare_pdfs` give fractions.

What WAA catches, we catch: most .docx metrics score 0 when a file cannot be opened (missing,
not a Word file, ...). What WAA lets through, we let through: `compare_highlighted_text` on a
missing file, `check_tabstops` with no non-blank paragraph, `is_first_line_centered` on a
document without paragraphs, ... raise, and the engine turns that into an evaluation error.

Optional packages (the 'office' extra) are imported inside each metric, at the start of every
call, so a missing package is always an error that names it, never a silent 0:
python-docx (.docx), odfpy (.odt), PyMuPDF (PDF text) and rapidfuzz (fuzzy ratios).
`find_default_font` and `compare_highlighted_text` need only the standard library.

Paragraph text comes from python-docx, whose `Paragraph.text` (1.x) includes hyperlink text;
python-docx 0.8 left it out. WAA does not pin a version; we assume a current one (>= 1.1).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
import zipfile
from typing import Any

from adapters.waa.evaluator.errors import MissingDependencyError, require
from adapters.waa.evaluator.metrics import metric

_EXTRA = "office"

# WAA behaviours that look like bugs but are kept, because they decide WAA's published scores.
DOCS_KNOWN_QUIRKS: list[str] = [
    "compare_docx_files: file types are told apart by a case-sensitive '.docx'/'.odt' suffix of "
    "both paths; any other pair (including '.DOCX' or one .docx and one .odt) scores 0.",
    "compare_docx_files on .odt: a paragraph's text is only its direct text and the direct text "
    "of its text:span children; spaces written as text:s, tabs, line breaks, links and nested "
    "spans are left out.",
    "compare_docx_files with ignore_blanks (the default) compares the whole documents' text with "
    "every whitespace run made one space, so paragraph boundaries do not count.",
    "compare_line_spacing, evaluate_strike_through_last_paragraph, check_italic_font_size_14 and "
    "check_highlighted_words first require compare_docx_files (default options) to pass.",
    "evaluate_strike_through_last_paragraph: a last paragraph without runs scores 1; a document "
    "without paragraphs raises IndexError.",
    "check_italic_font_size_14 only looks at runs whose italic is set directly (not by a style).",
    "compare_font_names: a run without a direct ASCII font (run.font.name None) fails; a "
    "document without runs scores 1; only body paragraphs are checked, not tables.",
    "compare_subscript_contains scores 1 as soon as one pair of runs at the same paragraph and "
    "run position are both subscript, and 0 otherwise.",
    "check_tabstops can score below 0 when tab positions differ by more than the text width "
    "(the engine reports such a value as an evaluation_error); it raises ZeroDivisionError when "
    "neither document has a non-blank paragraph, and IndexError when `index` is past a "
    "paragraph's tab-separated parts.",
    "has_page_numbers_in_footers only reads the first paragraph of each section's footer and "
    "accepts any digit (str.isdigit) there as a page number.",
    "compare_highlighted_text does not catch errors: a missing or non-zip file raises. It "
    "compares the *sets* of the first w:t text of runs with a w:highlight other than 'none' "
    "(LibreOffice often exports highlighting as w:shd, which this ignores).",
    "check_highlighted_words scores 1 when *no* span of the first file uses an automatic style "
    "with background #ffff00 (it checks that highlighting was removed); the odfpy load of the "
    "first file is not guarded, so a .docx pair that passes compare_docx_files raises there.",
    "find_default_font reads rules['font_name'] before anything else (a KeyError even for a "
    "missing file); an unreadable file counts as 'no default font' (None), so font_name None "
    "with a missing file scores 1.",
    "compare_pdfs has no None check: PyMuPDF opens a None or '' path as an empty PDF, so a None "
    "result against a gold PDF without text scores 1. Any error opening a pair scores 0 for that "
    "pair. When only the expected value is a list, the result is zipped with it as is (a string "
    "result pairs its characters with the gold paths); an empty expected list raises "
    "ZeroDivisionError.",
]

_W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_OOR_NS = "http://openoffice.org/2001/registry"


# -- lazy imports ----------------------------------------------------------------------------


def _need_docx(what: str) -> Any:
    return require("docx", what=what, packages="python-docx", extra=_EXTRA)


def _need_odf(what: str) -> Any:
    require("odf.text", what=what, packages="odfpy", extra=_EXTRA)
    return require("odf", what=what, packages="odfpy", extra=_EXTRA)


def _need_fuzz(what: str) -> Any:
    return require("rapidfuzz.fuzz", what=what, packages="rapidfuzz", extra=_EXTRA)


def _need_pymupdf(what: str) -> Any:
    try:
        import pymupdf
    except ImportError:
        try:  # PyMuPDF before 1.24.3 only has the old module name
            import fitz as pymupdf  # type: ignore[no-redef]
        except ImportError as exc:
            raise MissingDependencyError(what, "PyMuPDF", extra=_EXTRA) from exc
    return pymupdf


# -- helpers ---------------------------------------------------------------------------------


def _open_docx(*paths: Any) -> list[Any] | None:
    """python-docx Documents for `paths`, or None when any cannot be opened (WAA catches every
    exception there and scores 0)."""
    import docx

    try:
        return [docx.Document(path) for path in paths]
    except Exception:  # noqa: BLE001 - WAA: any failure to open scores 0
        return None


def _collapse_blanks(paragraphs: list[str]) -> str:
    # Same result as WAA's `\s+` -> " " then strip(): `\s` and str.split() use the same
    # definition of whitespace for str patterns.
    return " ".join("\n".join(paragraphs).split())


def _odt_paragraph_texts(document: Any) -> list[str]:
    """Text of every text:p, as WAA reads it: direct text nodes plus the direct text nodes of
    text:span children; everything else inside the paragraph is skipped."""
    from odf.text import P

    texts = []
    for paragraph in document.getElementsByType(P):
        parts: list[str] = []
        for child in paragraph.childNodes:
            if child.nodeType == child.TEXT_NODE:
                parts.append(child.data)
            elif child.nodeType == child.ELEMENT_NODE and child.tagName == "text:span":
                parts.extend(grand.data for grand in child.childNodes if grand.nodeType == grand.TEXT_NODE)
        texts.append("".join(parts))
    return texts


# -- metrics ---------------------------------------------------------------------------------


@metric("compare_docx_files", files=2)
def compare_docx_files(file1: Any, file2: Any, **options: Any) -> float:
    """WAA `compare_docx_files` (docs.py): compare the paragraph text of two .docx (python-docx)
    or two .odt (odfpy) files.

    Options: `ignore_blanks` (default True: the documents' joined text with whitespace runs
    collapsed must be equal), `ignore_case`, `ignore_order` (sort paragraphs first) and
    `content_only` (rapidfuzz ratio of the collapsed texts / 100, a fraction). With
    ignore_blanks False, the paragraph lists must match one by one. A None/empty path, a file
    that cannot be opened or a pair that is not both .docx / both .odt scores 0; a non-string
    path raises AttributeError, as in WAA. Other options are accepted and ignored."""
    _need_docx("compare_docx_files")
    _need_odf("compare_docx_files")
    ignore_blanks = options.get("ignore_blanks", True)
    ignore_case = options.get("ignore_case", False)
    ignore_order = options.get("ignore_order", False)
    content_only = options.get("content_only", False)
    fuzz = _need_fuzz("compare_docx_files with content_only") if content_only else None

    if not file1 or not file2:
        return 0.0

    if file1.endswith(".docx") and file2.endswith(".docx"):
        documents = _open_docx(file1, file2)
        if documents is None:
            return 0.0
        ours, gold = ([p.text for p in doc.paragraphs] for doc in documents)
    elif file1.endswith(".odt") and file2.endswith(".odt"):
        from odf.opendocument import load

        try:
            odt1, odt2 = load(file1), load(file2)
        except Exception:  # noqa: BLE001 - WAA: any failure to open scores 0
            return 0.0
        ours, gold = _odt_paragraph_texts(odt1), _odt_paragraph_texts(odt2)
    else:
        return 0.0
    if ignore_order:
        ours, gold = sorted(ours), sorted(gold)

    if content_only or ignore_blanks:
        text1, text2 = _collapse_blanks(ours), _collapse_blanks(gold)
        if ignore_case:
            text1, text2 = text1.lower(), text2.lower()
        if content_only:
            return fuzz.ratio(text1, text2) / 100.0
        return 1.0 if text1 == text2 else 0.0

    if len(ours) != len(gold):
        return 0.0
    for mine, theirs in zip(ours, gold):
        if ignore_case:
            mine, theirs = mine.lower(), theirs.lower()
        if mine != theirs:
            return 0.0
    return 1.0


@metric("compare_line_spacing", files=2)
def compare_line_spacing(docx_file1: Any, docx_file2: Any) -> float:
    """WAA `compare_line_spacing` (docs.py): 1 iff compare_docx_files (default options) passes,
    both documents have as many paragraphs and each pair has an equal
    `paragraph_format.line_spacing` (python-docx: a float multiple, a Length, or None when not
    set directly). None paths or unreadable files score 0."""
    _need_docx("compare_line_spacing")
    _need_odf("compare_line_spacing")
    if not docx_file1 or not docx_file2:
        return 0.0
    if not compare_docx_files(docx_file1, docx_file2):
        return 0.0
    documents = _open_docx(docx_file1, docx_file2)
    if documents is None:
        return 0.0
    paragraphs1, paragraphs2 = documents[0].paragraphs, documents[1].paragraphs
    if len(paragraphs1) != len(paragraphs2):
        return 0.0
    same = all(
        p1.paragraph_format.line_spacing == p2.paragraph_format.line_spacing
        for p1, p2 in zip(paragraphs1, paragraphs2)
    )
    return 1.0 if same else 0.0


@metric("evaluate_strike_through_last_paragraph", files=2)
def evaluate_strike_through_last_paragraph(file_path1: Any, file_path2: Any) -> float:
    """WAA `evaluate_strike_through_last_paragraph` (docs.py): 1 iff compare_docx_files passes
    and every run of the first file's last body paragraph has strike-through set directly
    (`run.font.strike`); a last paragraph without runs scores 1, a document without paragraphs
    raises IndexError, as in WAA."""
    _need_docx("evaluate_strike_through_last_paragraph")
    _need_odf("evaluate_strike_through_last_paragraph")
    if not file_path1 or not file_path2:
        return 0.0
    if not compare_docx_files(file_path1, file_path2):
        return 0.0
    documents = _open_docx(file_path1)
    if documents is None:
        return 0.0
    last = documents[0].paragraphs[-1]
    return 1.0 if all(run.font.strike for run in last.runs) else 0.0


@metric("check_tabstops", files=2)
def check_tabstops(docx_file1: Any, docx_file2: Any, **kwargs: Any) -> float:
    """WAA `check_tabstops` (docs.py): how close the first file's tab stops are to the second's.

    Only non-blank paragraphs count, and both files need as many. With
    `word_number_split_by_tabstop` N (and `index`, default 0), every such paragraph of the first
    file must have exactly N words in its `index`-th tab-separated part. Per paragraph pair,
    the direct tab stops (ignoring 'clear' ones and left ones at position 0) must agree in count
    and alignment; the score is 1 minus the mean, over paragraphs, of the summed position
    differences divided by the second file's first-section text width: a fraction, which can
    even be negative. Any mismatch scores 0.0; None paths or unreadable files score 0.0.
    ZeroDivisionError (no non-blank paragraph), IndexError (`index` past the parts) and errors
    from a section without page size or margins are raised, as in WAA."""
    _need_docx("check_tabstops")
    from docx.enum.text import WD_TAB_ALIGNMENT as align
    if not docx_file1 or not docx_file2:
        return 0.0
    documents = _open_docx(docx_file1, docx_file2)
    if documents is None:
        return 0.0
    doc1, doc2 = documents
    paragraphs1 = [p for p in doc1.paragraphs if p.text.strip()]
    paragraphs2 = [p for p in doc2.paragraphs if p.text.strip()]
    if len(paragraphs1) != len(paragraphs2):
        return 0.0

    wanted_words = kwargs.get("word_number_split_by_tabstop", None)
    if wanted_words is not None:
        index = kwargs.get("index", 0)
        for paragraph in paragraphs1:
            part = paragraph.text.split("\t")[index]
            if len(part.split()) != wanted_words:
                return 0.0

    section = doc2.sections[0]
    text_width = section.page_width - section.left_margin - section.right_margin

    def counted(paragraph: Any) -> list[Any]:
        return [
            stop
            for stop in paragraph.paragraph_format.tab_stops
            if not (stop.alignment == align.CLEAR or (stop.alignment == align.LEFT and stop.position == 0))
        ]

    penalty = 0.0
    for p1, p2 in zip(paragraphs1, paragraphs2):
        stops1, stops2 = counted(p1), counted(p2)
        if len(stops1) != len(stops2):
            return 0.0
        distance = 0.0
        for s1, s2 in zip(stops1, stops2):
            if s1.alignment != s2.alignment:
                return 0.0
            distance += abs(s1.position - s2.position)
        penalty += distance / text_width
    return 1 - penalty / len(paragraphs1)


@metric("is_first_line_centered", files=1)
def is_first_line_centered(docx_file: Any) -> float:
    """WAA `is_first_line_centered` (docs.py): 1 iff the first body paragraph's direct alignment
    is CENTER (alignment inherited from a style does not count). None/unreadable: 0; a document
    without paragraphs raises IndexError, and an alignment python-docx cannot map (e.g. 'start')
    raises ValueError, as in WAA."""
    _need_docx("is_first_line_centered")
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT
    if not docx_file:
        return 0.0
    documents = _open_docx(docx_file)
    if documents is None:
        return 0.0
    first = documents[0].paragraphs[0]
    centered = first.paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER
    return 1.0 if centered else 0.0


@metric("compare_font_names", files=1)
def compare_font_names(docx_file: Any, rules: Any) -> float:
    """WAA `compare_font_names` (docs.py): 1 iff every run of every body paragraph has
    `run.font.name` (the direct ASCII font) equal to `rules["font_name"]`. None/unreadable: 0
    (before `rules` is read); a rules object without font_name raises."""
    _need_docx("compare_font_names")
    if not docx_file:
        return 0.0
    documents = _open_docx(docx_file)
    if documents is None:
        return 0.0
    wanted = rules["font_name"]
    for paragraph in documents[0].paragraphs:
        for run in paragraph.runs:
            if run.font.name != wanted:
                return 0.0
    return 1.0


@metric("compare_docx_tables", files=2)
def compare_docx_tables(docx_file1: Any, docx_file2: Any) -> float:
    """WAA `compare_docx_tables` (docs.py): 1 iff both documents have as many top-level tables,
    each pair has as many rows and columns, and every cell's stripped text is equal.
    None/unreadable: 0."""
    _need_docx("compare_docx_tables")
    if not docx_file1 or not docx_file2:
        return 0.0
    documents = _open_docx(docx_file1, docx_file2)
    if documents is None:
        return 0.0
    tables1, tables2 = documents[0].tables, documents[1].tables
    if len(tables1) != len(tables2):
        return 0.0
    for table1, table2 in zip(tables1, tables2):
        rows, columns = len(table1.rows), len(table1.columns)
        if rows != len(table2.rows) or columns != len(table2.columns):
            return 0.0
        for i in range(rows):
            for j in range(columns):
                if table1.cell(i, j).text.strip() != table2.cell(i, j).text.strip():
                    return 0.0
    return 1.0


@metric("check_italic_font_size_14", files=2)
def check_italic_font_size_14(path1: Any, path2: Any) -> float:
    """WAA `check_italic_font_size_14` (docs.py): 1 iff compare_docx_files passes and every
    body run of the first file that is directly italic has a direct size of exactly 14 pt.
    None/unreadable: 0."""
    _need_docx("check_italic_font_size_14")
    _need_odf("check_italic_font_size_14")
    if not path1 or not path2:
        return 0.0
    if not compare_docx_files(path1, path2):
        return 0.0
    documents = _open_docx(path1)
    if documents is None:
        return 0.0
    for paragraph in documents[0].paragraphs:
        for run in paragraph.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


@metric("compare_subscript_contains", files=2)
def compare_subscript_contains(docx_file1: Any, docx_file2: Any) -> float:
    """WAA `compare_subscript_contains` (docs.py): 1 as soon as a run of the first file and the
    run at the same (paragraph, run) position of the second are both subscript; else 0.
    None/unreadable: 0."""
    _need_docx("compare_subscript_contains")
    if not docx_file1 or not docx_file2:
        return 0.0
    documents = _open_docx(docx_file1, docx_file2)
    if documents is None:
        return 0.0
    for para1, para2 in zip(documents[0].paragraphs, documents[1].paragraphs):
        for run1, run2 in zip(para1.runs, para2.runs):
            if run1.font.subscript and run2.font.subscript:
                return 1.0
    return 0.0


def _highlighted_run_texts(path: str) -> list[Any]:
    with zipfile.ZipFile(path, "r") as package:
        with package.open("word/document.xml") as stream:
            root = ET.parse(stream).getroot()
    ns = {"w": _W_NS}
    texts = []
    for run in root.findall(".//w:r", ns):
        mark = run.find(".//w:highlight", ns)
        if mark is None or mark.get(f"{{{_W_NS}}}val") == "none":
            continue
        first_text = run.find(".//w:t", ns)
        if first_text is not None:
            texts.append(first_text.text)
    return texts


@metric("compare_highlighted_text", files=2)
def compare_highlighted_text(file1: Any, file2: Any) -> float:
    """WAA `compare_highlighted_text` (docs.py, marked deprecated there): 1 iff the two .docx
    files' word/document.xml have the same *set* of highlighted texts: for every w:r with a
    w:highlight whose val is not 'none', the text of its first w:t. Read with zipfile and
    ElementTree (no optional package). None paths score 0; unlike the other .docx metrics,
    errors are not caught: a missing file, a non-zip file or a zip without word/document.xml
    raises, as in WAA."""
    if not file1 or not file2:
        return 0.0
    ours = _highlighted_run_texts(file1)
    gold = _highlighted_run_texts(file2)
    return 1.0 if set(ours) == set(gold) else 0.0


@metric("find_default_font", files=1)
def find_default_font(config_file_path: Any, rules: Any) -> float:
    """WAA `find_default_font` (docs.py): 1 iff Writer's default font in registrymodifications.xcu
    (the value of prop 'Standard' under the item whose oor:path is
    /org.openoffice.Office.Writer/DefaultFont; the last one found wins) equals
    `rules["font_name"]`. `rules["font_name"]` is read first, so a rules object without it
    raises even for a None path; a None/empty path scores 0; an unreadable or malformed file
    counts as no default font (None), as in WAA."""
    wanted = rules["font_name"]
    if not config_file_path:
        return 0.0
    found = None
    try:
        root = ET.parse(config_file_path).getroot()
        path_key, name_key = f"{{{_OOR_NS}}}path", f"{{{_OOR_NS}}}name"
        for item in root.iterfind(".//item"):
            if item.get(path_key) != "/org.openoffice.Office.Writer/DefaultFont":
                continue
            for prop in item.iterfind(".//prop"):
                if prop.get(name_key) != "Standard":
                    continue
                for value in prop.findall("value"):
                    found = value.text
    except Exception:  # noqa: BLE001 - WAA logs any error and goes on with no font found
        pass
    return 1.0 if found == wanted else 0.0


@metric("has_page_numbers_in_footers", files=1)
def has_page_numbers_in_footers(docx_file: Any) -> float:
    """WAA `has_page_numbers_in_footers` (docs.py): 1 iff, for every section, the first
    paragraph of its footer (python-docx follows 'linked to previous') contains a digit
    (str.isdigit, so any Unicode digit counts). A document without sections scores 1.
    None/unreadable: 0."""
    _need_docx("has_page_numbers_in_footers")
    if not docx_file:
        return 0.0
    documents = _open_docx(docx_file)
    if documents is None:
        return 0.0
    for section in documents[0].sections:
        footer = section.footer
        if footer is None:
            return 0.0
        paragraphs = footer.paragraphs
        first_text = paragraphs[0].text if paragraphs else ""
        if not any(char.isdigit() for char in first_text):
            return 0.0
    return 1.0


@metric("check_highlighted_words", files=2)
def check_highlighted_words(file_path1: Any, file_path2: Any) -> float:
    """WAA `check_highlighted_words` (docs.py), for .odt files: 1 iff compare_docx_files
    passes and no text:span of the first file names (text:style-name) an automatic style with
    a child whose fo:background-color is '#ffff00', i.e. the yellow highlighting is gone;
    0 if one does. None paths score 0. The odfpy load of the first file is not guarded (a .docx
    pair that passes compare_docx_files raises there), and odfpy's own errors for attributes an
    element does not allow propagate, as in WAA."""
    _need_docx("check_highlighted_words")
    _need_odf("check_highlighted_words")
    from odf.opendocument import load
    from odf.text import Span

    if not file_path1 or not file_path2:
        return 0.0
    if not compare_docx_files(file_path1, file_path2):
        return 0.0
    document = load(file_path1)
    for span in document.getElementsByType(Span):
        style_name = span.getAttribute("stylename")
        if not style_name:
            continue
        highlighted = False
        # WAA stops only the innermost loop at a match, so every automatic style is still
        # visited (odfpy errors on later styles would still raise there).
        for style in document.automaticstyles.childNodes:
            if style.getAttribute("name") != style_name:
                continue
            for child in style.childNodes:
                if child.getAttribute("backgroundcolor") == "#ffff00":
                    highlighted = True
                    break
        if highlighted:
            return 0.0
    return 1.0


@metric("compare_pdfs", files=2)
def compare_pdfs(pdf1_path: Any, pdf2_path: Any) -> float:
    """WAA `compare_pdfs` (chrome.py): mean over path pairs of rapidfuzz `fuzz.ratio` / 100
    between the PDFs' texts (PyMuPDF `page.get_text()` of every page, concatenated, stripped):
    a fraction.

    Unless the second argument is a list, both are wrapped into one-item lists; a list second
    argument is zipped with the first as it is. A pair that fails (missing or non-PDF file)
    adds 0 but still counts in the mean. There is no None check: PyMuPDF opens None (or '') as
    an empty PDF, whose text is ''. An empty expected list raises ZeroDivisionError."""
    fitz = _need_pymupdf("compare_pdfs")
    fuzz = _need_fuzz("compare_pdfs")
    if type(pdf2_path) != list:  # noqa: E721 - WAA tests the exact type
        pdf1_path, pdf2_path = [pdf1_path], [pdf2_path]

    def pdf_text(path: Any) -> str:
        with fitz.open(path) as pdf:
            return "".join(page.get_text() for page in pdf).strip()

    total = 0.0
    for path1, path2 in zip(pdf1_path, pdf2_path):
        try:
            total += fuzz.ratio(pdf_text(path1), pdf_text(path2)) / 100
        except Exception:  # noqa: BLE001 - WAA logs any error and adds nothing for the pair
            pass
    return total / len(pdf2_path)
