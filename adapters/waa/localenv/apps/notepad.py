"""Simulated Notepad and its Save As / Open dialogs.

Notepad keeps its text with ``\\n`` line ends and writes CRLF, UTF-8, as Windows 11 Notepad does.
The caret is always at the end of the text; Ctrl+A selects everything so typing replaces it.
Closing a document with unsaved changes asks "Do you want to save changes to ...?" (Save / Don't
Save / Cancel) in a dialog of its own and stays open meanwhile, as Windows' Notepad does, when the
desktop has save prompts on (quirks mode's ``save_prompts``); otherwise it closes at once.
Deviation: Save on the prompt of an untitled document opens Save As and closes the prompt;
Notepad then stays open (Windows' closes it once the file is saved).
"""

from __future__ import annotations

from ..desktop import Control, Desktop, EditState, Window
from ..filesystem import USER_HOME, PathError, WinPath, parse_winpath

FILE_MENU = ("New", "Open...", "Save", "Save As...", "Exit")


class Notepad(Window):
    """A Notepad window editing one document."""

    cls_name = "Notepad"

    def __init__(self, wid: int, rect: tuple[int, int, int, int], path: str | None = None, text: str = "") -> None:
        super().__init__(wid, rect)
        self.path = path  # Windows path of the document, None while untitled
        self.editor = EditState(text)
        self.saved_text = text  # what the document holds on disk (or "" while untitled)
        self.menu_open = False
        self.focus = "editor"

    @property
    def modified(self) -> bool:
        """Whether the text differs from what was last opened or saved."""
        return self.editor.text != self.saved_text

    def close(self, desk: Desktop) -> None:
        """Close, or ask to save first (a prompt of its own) when the text is not saved and the
        desktop has save prompts on."""
        if desk.save_prompts and self.modified:
            open_save_prompt(desk, self)
            return
        desk.remove_window(self)

    @property
    def title(self) -> str:
        name = "Untitled" if self.path is None else parse_winpath(self.path).name
        return f"{name} - Notepad"

    def controls(self, desk: Desktop) -> list[Control]:
        x0, y0, x1, y1 = self.client_rect
        menubar = Control("MenuBar", "Application", (x0, y0, x1, y0 + 28), cls="MenuBar")
        for i, label in enumerate(("File", "Edit", "View")):
            menubar.children.append(Control("MenuItem", label, (x0 + 4 + 52 * i, y0 + 2, x0 + 52 + 52 * i, y0 + 26),
                                            key=f"menu:{label}", expanded=self.menu_open and label == "File"))
        editor = Control("Edit", "Text Editor", (x0 + 2, y0 + 30, x1 - 2, y1 - 26), key="editor",
                         text=self.editor.text, value=self.editor.text, editable=True,
                         text_selected=self.editor.all_selected)
        lines = self.editor.text.split("\n")
        status = Control("StatusBar", "Status Bar", (x0, y1 - 24, x1, y1), cls="StatusBar")
        status.children.append(Control("Text", f"Ln {len(lines)}, Col {len(lines[-1]) + 1}",
                                       (x0 + 8, y1 - 22, x0 + 160, y1 - 2)))
        out = [menubar, editor, status]
        if self.menu_open:
            menu = Control("Menu", "File", (x0 + 4, y0 + 28, x0 + 184, y0 + 30 + 26 * len(FILE_MENU)), cls="Menu")
            for i, label in enumerate(FILE_MENU):
                menu.children.append(Control("MenuItem", label, (x0 + 6, y0 + 30 + 26 * i, x0 + 182, y0 + 54 + 26 * i),
                                             key=f"item:{label}"))
            out.append(menu)
        return out

    def on_click(self, desk: Desktop, key: str, *, double: bool, button: str) -> None:
        if key == "menu:File":
            self.menu_open = not self.menu_open
            return
        was_open, self.menu_open = self.menu_open, False
        if key.startswith("item:") and was_open:
            self.run_command(desk, key[5:])
        elif key == "editor":
            self.focus = "editor"
            self.editor.all_selected = False

    def run_command(self, desk: Desktop, command: str) -> None:
        """Run a File menu command."""
        if command == "New":
            self.path, self.editor, self.saved_text = None, EditState(), ""
        elif command == "Open...":
            open_file_dialog(desk, self, "open")
        elif command == "Save":
            self.save(desk)
        elif command == "Save As...":
            open_file_dialog(desk, self, "save")
        elif command == "Exit":
            self.close(desk)

    def save(self, desk: Desktop) -> None:
        """Ctrl+S: write to the current file, or ask for a name when untitled."""
        if self.path is None:
            open_file_dialog(desk, self, "save")
        else:
            self.write_to(desk, parse_winpath(self.path))

    def write_to(self, desk: Desktop, path: WinPath) -> None:
        """Write the document (CRLF, UTF-8) and retitle the window."""
        data = self.editor.text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8")
        desk.fs.write_bytes(path, data)
        self.path = str(desk.fs.to_winpath(path))
        self.saved_text = self.editor.text

    def load(self, desk: Desktop, path: WinPath) -> None:
        """Show a file's contents."""
        raw = desk.fs.read_bytes(path)
        text = raw.decode("utf-8-sig", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        self.path, self.editor = str(desk.fs.to_winpath(path)), EditState(text)
        self.saved_text = text

    def on_key(self, desk: Desktop, key: str, mods: frozenset[str]) -> None:
        if key == "escape":
            self.menu_open = False
        elif key == "s" and mods == {"ctrl"}:
            self.save(desk)
        elif key == "s" and mods == {"ctrl", "shift"}:
            open_file_dialog(desk, self, "save")
        elif key == "o" and mods == {"ctrl"}:
            open_file_dialog(desk, self, "open")
        elif key == "n" and mods == {"ctrl"}:
            self.run_command(desk, "New")
        elif key == "c" and mods == {"ctrl"}:
            if self.editor.all_selected:
                desk.clipboard = self.editor.text
        elif key == "x" and mods == {"ctrl"}:
            if self.editor.all_selected:
                desk.clipboard, self.editor = self.editor.text, EditState()
        elif key == "v" and mods == {"ctrl"}:
            self.editor.type(desk.clipboard)
        elif key == "enter" and not mods:
            self.editor.type("\n")
        elif key == "tab" and not mods:
            self.editor.type("\t")
        else:
            self.editor.key(key, mods)

    def on_text(self, desk: Desktop, text: str) -> None:
        self.menu_open = False
        self.editor.type(text)


class FileDialog(Window):
    """The common Save As / Open dialog, simplified to a folder field and a file name field."""

    cls_name = "#32770"

    def __init__(self, wid: int, rect: tuple[int, int, int, int], owner: int, mode: str, folder: str, name: str) -> None:
        super().__init__(wid, rect)
        self.owner = owner
        self.mode = mode  # "save" or "open"
        self.folder = EditState(folder)
        self.filename = EditState(name, all_selected=True)
        self.focus = "filename"
        self.error = ""

    @property
    def title(self) -> str:
        return "Save As" if self.mode == "save" else "Open"

    def controls(self, desk: Desktop) -> list[Control]:
        x0, y0, x1, y1 = self.client_rect
        ok = "Save" if self.mode == "save" else "Open"
        out = [
            Control("Text", "Folder:", (x0 + 16, y0 + 20, x0 + 110, y0 + 44)),
            Control("Edit", "Folder:", (x0 + 112, y0 + 18, x1 - 16, y0 + 46), key="folder",
                    text=self.folder.text, value=self.folder.text, editable=True,
                    text_selected=self.folder.all_selected),
            Control("Text", "File name:", (x0 + 16, y0 + 64, x0 + 110, y0 + 88)),
            Control("Edit", "File name:", (x0 + 112, y0 + 62, x1 - 16, y0 + 90), key="filename",
                    text=self.filename.text, value=self.filename.text, editable=True,
                    text_selected=self.filename.all_selected),
            Control("Button", ok, (x1 - 220, y1 - 46, x1 - 120, y1 - 14), key="ok"),
            Control("Button", "Cancel", (x1 - 112, y1 - 46, x1 - 16, y1 - 14), key="cancel"),
        ]
        if self.error:
            out.append(Control("Text", self.error, (x0 + 16, y0 + 100, x1 - 16, y0 + 124)))
        return out

    def _field(self) -> EditState | None:
        return {"folder": self.folder, "filename": self.filename}.get(self.focus)

    def on_click(self, desk: Desktop, key: str, *, double: bool, button: str) -> None:
        if key in ("folder", "filename"):
            if self.focus != key:
                self.focus = key
                self._field().all_selected = True  # focusing a Windows edit selects its text
        elif key == "ok":
            self.confirm(desk)
        elif key == "cancel":
            self.close(desk)

    def on_key(self, desk: Desktop, key: str, mods: frozenset[str]) -> None:
        field = self._field()
        if key == "enter":
            self.confirm(desk)
        elif key == "escape":
            self.close(desk)
        elif key == "tab":
            self.focus = "filename" if self.focus == "folder" else "folder"
            self._field().all_selected = True
        elif key == "v" and mods == {"ctrl"} and field is not None:
            field.type(desk.clipboard.replace("\n", " "))
        elif field is not None:
            field.key(key, mods)

    def on_text(self, desk: Desktop, text: str) -> None:
        field = self._field()
        if field is not None:
            field.type(text)

    def confirm(self, desk: Desktop) -> None:
        """Save or open the chosen file; errors keep the dialog open with a message."""
        owner = desk.window(self.owner or -1)
        name = self.filename.text.strip()
        if not name or "*" in name:
            return
        try:
            target = parse_winpath(name) if ":" in name else parse_winpath(self.folder.text.strip() + "\\" + name)
            if self.mode == "save" and "." not in target.name:
                target = target.parent.child(target.name + ".txt")  # the *.txt filter appends .txt
            if not desk.fs.is_dir(target.parent):
                self.error = f"Path does not exist: {target.parent}"
                return
            if not isinstance(owner, Notepad):
                self.close(desk)
                return
            if self.mode == "save":
                owner.write_to(desk, target)
            else:
                if not desk.fs.is_file(target):
                    self.error = f"{target.name}: File not found."
                    return
                owner.load(desk, target)
        except (PathError, OSError) as exc:
            self.error = str(exc)[:80]
            return
        self.close(desk)
        desk.activate(owner)


class SavePrompt(Window):
    """Notepad's "Do you want to save changes to ...?" prompt, asked when a document with unsaved
    changes is closed. Save (Enter) saves, Don't Save (N) closes Notepad without saving, Cancel
    (Escape) keeps it open."""

    cls_name = "#32770"

    def __init__(self, wid: int, rect: tuple[int, int, int, int], owner: int, document: str) -> None:
        super().__init__(wid, rect)
        self.owner = owner
        self.document = document
        self.focus = "save"

    @property
    def title(self) -> str:
        return "Notepad"

    def controls(self, desk: Desktop) -> list[Control]:
        x0, y0, x1, y1 = self.client_rect
        return [
            Control("Text", f"Do you want to save changes to {self.document}?", (x0 + 16, y0 + 16, x1 - 16, y0 + 44)),
            Control("Button", "Save", (x1 - 330, y1 - 46, x1 - 230, y1 - 14), key="save"),
            Control("Button", "Don't Save", (x1 - 222, y1 - 46, x1 - 122, y1 - 14), key="dont_save"),
            Control("Button", "Cancel", (x1 - 114, y1 - 46, x1 - 16, y1 - 14), key="cancel"),
        ]

    def on_click(self, desk: Desktop, key: str, *, double: bool, button: str) -> None:
        if key in ("save", "dont_save", "cancel"):
            self.answer(desk, key)

    def on_key(self, desk: Desktop, key: str, mods: frozenset[str]) -> None:
        answers = {"enter": self.focus, "escape": "cancel", "n": "dont_save", "s": "save"}
        if key in answers and (not mods or mods == {"alt"}):
            self.answer(desk, answers[key])

    def answer(self, desk: Desktop, choice: str) -> None:
        """What the chosen button does."""
        owner = desk.window(self.owner or -1)
        desk.remove_window(self)
        if not isinstance(owner, Notepad):
            return
        if choice == "dont_save":
            desk.remove_window(owner)
        elif choice == "save":
            owner.save(desk)
            if not owner.modified:
                desk.remove_window(owner)


def open_save_prompt(desk: Desktop, owner: Notepad) -> SavePrompt:
    """Ask whether to save `owner`'s changes (one prompt at a time)."""
    for w in desk.windows:
        if isinstance(w, SavePrompt) and w.owner == owner.wid:
            desk.activate(w)
            return w
    x0, y0 = owner.rect[0] + 120, owner.rect[1] + 140
    name = "Untitled" if owner.path is None else parse_winpath(owner.path).name
    prompt = SavePrompt(desk.new_wid(), (x0, y0, x0 + 460, y0 + 150), owner.wid, name)
    desk.add_window(prompt)
    return prompt


def open_file_dialog(desk: Desktop, owner: Notepad, mode: str) -> FileDialog:
    """Open a Save As / Open dialog for a Notepad window (one at a time)."""
    for w in desk.windows:
        if isinstance(w, FileDialog) and w.owner == owner.wid:
            desk.activate(w)
            return w
    folder = str(parse_winpath(owner.path).parent) if owner.path else f"{USER_HOME}\\Documents"
    name = parse_winpath(owner.path).name if (owner.path and mode == "save") else "*.txt"
    x0, y0 = owner.rect[0] + 60, owner.rect[1] + 90
    dlg = FileDialog(desk.new_wid(), (x0, y0, x0 + 600, y0 + 210), owner.wid, mode, folder, name)
    desk.add_window(dlg)
    return dlg


def open_notepad(desk: Desktop, path: WinPath | None = None) -> Notepad:
    """Start Notepad, optionally showing a file (an existing window for it is reused)."""
    if path is not None:
        for w in desk.windows:
            if isinstance(w, Notepad) and w.path and w.path.lower() == str(desk.fs.to_winpath(path)).lower():
                desk.activate(w)
                return w
    win = Notepad(desk.new_wid(), desk.cascade_rect(840, 560, 160, 60))
    if path is not None:
        if desk.fs.is_file(path):
            win.load(desk, path)
        else:
            # Real Notepad first asks whether to create the file; it then saves to this path.
            win.path = str(path)
    desk.add_window(win)
    return win
