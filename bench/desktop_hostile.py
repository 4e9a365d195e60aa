"""128 classes of hostile text for the real-desktop bench (bench/desktop.py): quotes, escapes,
shell and Python injection, format strings, markup, paths, Unicode of many scripts and forms.

Every injection writes a marker under MARKER_DIR if it ever runs, so "ran nothing" is a check
of the guest's file system, not a hope. No C0 control characters besides tab and newline (an
editor does not keep them as typed: that is the editor, not the pipeline).
"""

from __future__ import annotations

MARKER_DIR = "/tmp/hostile-ran"


def hostile_texts() -> list[str]:
    """The 128 texts, each one class."""
    m = MARKER_DIR
    injections = [
        f"'); import os; os.makedirs('{m}', exist_ok=True); open('{m}/py1','w') #",
        f"\"); __import__('os').makedirs('{m}'); #",
        f"'''; import subprocess; subprocess.run(['mkdir','-p','{m}']); '''",
        f"\\'; exec(\"import os; os.mkdir('{m}')\") #",
        f"$(mkdir -p {m})", f"`mkdir -p {m}`", f"; mkdir -p {m};", f"&& mkdir -p {m} &&", f"| mkdir -p {m}",
        f"\n mkdir -p {m}", f"{{__import__('os').mkdir('{m}')}}", f"%(x)s {{0}} {{x!r}} ${{HOME}} %s %n %%",
        f"pyautogui.FAILSAFE=True; import os; os.mkdir('{m}')", f"\"; import os; os.mkdir(\"{m}\"); \"",
        f"'+__import__('os').system('mkdir -p {m}')+'", f"\\\\'); os.system('mkdir -p {m}') #",
        f"<script>alert(1)</script> mkdir -p {m}", f"]]></x><y>{m}</y><![CDATA[", "{{7*7}} ${7*7} #{7*7}",
        "\"\\\" \\\\\\\" \\x41 \\u0041 \\n not a newline", "ctrl+s alt+f4 win+r {ENTER} {TAB}",
        "' OR '1'='1'; DROP TABLE results; --", "../../../../etc/passwd C:\\Windows\\System32\\cmd.exe",
        "\\\\host.lan\\Data\\evil.ps1", "%APPDATA% %USERPROFILE% ~/.bashrc", "#!/bin/sh\nrm -rf ~ # not run",
    ]
    quoting = [
        "'single'", '"double"', "'mixed \" quotes'", '"mixed \' quotes"', "''''''", '""""""', "`backticks`",
        "\\", "\\\\", "trailing backslash \\", "\\'", '\\"', "r'raw\\string'", "b'bytes'", "f'{fmt}'",
        "tab\tseparated\tvalues", "two\nlines", "three\n\nlines with a blank", "   leading spaces",
        "trailing spaces   ", "", "a" * 200, "-".join(["x"] * 100), "{}[]()<>", "!@#$%^&*()_+-=~",
        "semicolon; colon: comma, period.", "question? exclamation!", "pipe | ampersand & tilde ~",
    ]
    unicode_text = [
        "Grüße aus Köln", "naïve café résumé", "Ελληνικά γράμματα", "Русский текст", "עברית מימין לשמאל",
        "العربية من اليمين", "हिन्दी पाठ", "ภาษาไทย", "中文字符测试", "日本語のテキスト", "한국어 텍스트",
        "emoji 😀🎉🚀", "flag 🇩🇪🇯🇵", "family 👨‍👩‍👧‍👦", "skin tone 👍🏽", "combining e\u0301 a\u0308",
        "zero\u200bwidth space", "no\u00a0break space", "rtl \u202eoverride\u202c end", "ligature ﬁ ﬂ",
        "math ∑∫√∞≠≤≥", "arrows ←↑→↓⇒", "box ┌─┐│└┘", "currency €£¥₹₿", "fullwidth ＡＢＣ１２３",
        "superscript x² y³", "fractions ½ ¼ ¾", "dashes – — ‒", "quotes “double” ‘single’ «guillemets»",
        "ellipsis … bullet •", "degree 25°C", "trademark ™ © ®", "music ♪♫", "chess ♔♕♖", "cards ♠♥♦♣",
        "Ωmega µicro Ångström", "ß ẞ ǅ ǈ", "Turkish İı", "Vietnamese Tiếng Việt", "Amharic ኢትዮጵያ",
        "Georgian ქართული", "Armenian Հայերեն", "Tamil தமிழ்", "Mongolian ᠮᠣᠩᠭᠣᠯ", "Cherokee ᏣᎳᎩ",
        "Braille ⠃⠗⠁⠊⠇⠇⠑", "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "cuneiform 𒀭", "variation ❤️ ☺︎", "tag 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    ]
    mixed = [
        f"Grüße'); import os; os.mkdir('{m}') #", f"日本語 $(mkdir -p {m})", f"emoji 😀 `mkdir -p {m}`",
        "error ERROR Error in text", "computer.clipboard.paste()", "computer.mouse.move_id(0)",
        "pyautogui.hotkey('ctrl','w')", "import pyautogui; pyautogui.press('enter')", "\"error\": true",
        "<desktop><frame name='x'/></desktop>", "&amp; &lt; &gt; &quot; &#0; &#x41;", "a\tb\nc\td",
        "line with CR-free newline\nnext", "1.0e308 -0 NaN inf", "None True False null",
        "%00 %0a %0d", "\u2028line separator", "\u2029paragraph separator", "\ufeffBOM start",
        "surrogate-free 𐍈", "long unicode " + "é" * 120, "mixed 中文 and English and 😀",
    ]
    texts = [*injections, *quoting, *unicode_text, *mixed]
    texts = [t for t in texts if t]  # an empty text is not an action
    while len(texts) < 128:
        texts.append(f"filler class {len(texts)}: ~!@#$%^&*()_+ ✓")
    return texts[:128]
