"""Simulated File Explorer: one folder view with an address bar, a toolbar and an item list.

New folder creates "New folder", "New folder (2)", ... and puts its name in rename mode with
the text selected, so typing replaces it and Enter commits. F2 or the Rename button renames the
selected item, Delete (key or button) moves it to the simulated recycle bin. Double click on a
folder navigates into it, on a text file opens it in Notepad. Deviations: no navigation pane,
no back/forward history, no confirmation when a rename would clash (the rename is refused).
"""

from __future__ import annotations

from ..desktop import Control, Desktop, EditState, Window
from ..filesystem import PathError, WinPath, display_name, parse_winpath

ROW_H = 26
TEXT_EXTENSIONS = (".txt", ".log", ".md", ".csv", ".json", ".ini", ".py", ".xml")


class Explorer(Window):
    """A File Explorer window showing one folder."""

    cls_name = "CabinetWClass"

    def __init__(self, wid: int, rect: tuple[int, int, int, int], folder: str) -> None:
        super().__init__(wid, rect)
        self.folder = folder
        self.address = EditState(folder)
        self.selected: str | None = None
        self.renaming: str | None = None  # name of the item being renamed
        self.rename_edit = EditState()
        self.focus = "list"

    @property
    def title(self) -> str:
        return display_name(self.folder)

    def entries(self, desk: Desktop) -> list[str]:
        """Entry names of the current folder (empty if it vanished)."""
        try:
            return desk.fs.listdir(self.folder)
        except (OSError, PathError):
            return []

    def controls(self, desk: Desktop) -> list[Control]:
        x0, y0, x1, y1 = self.client_rect
        toolbar = Control("ToolBar", "Command Bar", (x0, y0, x1, y0 + 36), cls="ToolBar")
        for i, label in enumerate(("New folder", "Rename", "Delete")):
            toolbar.children.append(Control("Button", label, (x0 + 8 + 110 * i, y0 + 4, x0 + 112 + 110 * i, y0 + 32),
                                            key=f"btn:{label}"))
        address_text = self.address.text if self.focus == "address" else self.folder
        address = Control("Edit", "Address", (x0 + 8, y0 + 40, x1 - 8, y0 + 68), key="address",
                          text=address_text, value=address_text, editable=True,
                          text_selected=self.focus == "address" and self.address.all_selected)
        items = Control("List", "Items View", (x0 + 8, y0 + 74, x1 - 8, y1 - 8), key="list", cls="List")
        is_dir = set()
        for name in self.entries(desk):
            try:
                if desk.fs.is_dir(parse_winpath(self.folder).child(name)):
                    is_dir.add(name)
            except PathError:
                pass
        max_rows = max(0, (items.rect[3] - items.rect[1] - 4) // ROW_H)
        for i, name in enumerate(self.entries(desk)[:max_rows]):
            top = items.rect[1] + 2 + ROW_H * i
            rect = (items.rect[0] + 2, top, items.rect[2] - 2, top + ROW_H - 2)
            item = Control("ListItem", name, rect, key=f"item:{name}", selected=name == self.selected,
                           value="File folder" if name in is_dir else "File")
            if name == self.renaming:
                item.children.append(Control("Edit", "Name", (rect[0] + 24, rect[1] + 1, rect[0] + 360, rect[3] - 1),
                                             key="rename", text=self.rename_edit.text, value=self.rename_edit.text,
                                             editable=True, text_selected=self.rename_edit.all_selected))
            items.children.append(item)
        return [toolbar, address, items]

    # -- commands ----------------------------------------------------------------------
    def path_of(self, name: str) -> WinPath:
        """Windows path of an entry of the current folder."""
        return parse_winpath(self.folder).child(name)

    def navigate(self, desk: Desktop, target: str) -> bool:
        """Show another folder; False when it does not exist."""
        try:
            if not desk.fs.is_dir(target):
                return False
            self.folder = str(desk.fs.to_winpath(target))
        except PathError:
            return False
        self.selected, self.renaming, self.focus = None, None, "list"
        self.address = EditState(self.folder)
        return True

    def new_folder(self, desk: Desktop) -> None:
        """Create "New folder" (or "New folder (n)") and start renaming it."""
        self.commit_rename(desk)
        existing = {e.lower() for e in self.entries(desk)}
        name, n = "New folder", 1
        while name.lower() in existing:
            n += 1
            name = f"New folder ({n})"
        desk.fs.makedirs(self.path_of(name), exist_ok=False)
        self.start_rename(name)

    def start_rename(self, name: str) -> None:
        """Put an item in rename mode with its whole name selected."""
        self.selected, self.renaming = name, name
        self.rename_edit = EditState(name, all_selected=True)
        self.focus = "rename"

    def commit_rename(self, desk: Desktop) -> None:
        """Apply a pending rename (an invalid or clashing name keeps the old one)."""
        if self.renaming is None:
            return
        old, new = self.renaming, self.rename_edit.text.strip().rstrip(".")
        self.renaming, self.focus = None, "list"
        if not new or new == old:
            return
        try:
            desk.fs.rename(self.path_of(old), new)
            self.selected = new
        except (OSError, PathError):
            self.selected = old

    def delete_selected(self, desk: Desktop) -> None:
        """Move the selected item to the recycle bin."""
        if self.selected is None:
            return
        try:
            desk.fs.recycle(self.path_of(self.selected))
        except (OSError, PathError):
            pass
        self.selected = None

    def open_item(self, desk: Desktop, name: str) -> None:
        """Double click / Enter on an item: navigate into a folder or open a file."""
        from ..launch import open_path

        path = self.path_of(name)
        if desk.fs.is_dir(path):
            self.navigate(desk, str(path))
        else:
            open_path(desk, str(path))

    # -- input -------------------------------------------------------------------------
    def on_click(self, desk: Desktop, key: str, *, double: bool, button: str) -> None:
        if key == "rename":
            return
        if key != "address" or self.focus != "address":
            self.commit_rename(desk)
        if key == "btn:New folder":
            self.new_folder(desk)
        elif key == "btn:Rename":
            if self.selected:
                self.start_rename(self.selected)
        elif key == "btn:Delete":
            self.delete_selected(desk)
        elif key == "address":
            if self.focus != "address":
                self.focus, self.address = "address", EditState(self.folder, all_selected=True)
        elif key.startswith("item:"):
            name = key[5:]
            self.selected, self.focus = name, "list"
            if double and button == "left":
                self.open_item(desk, name)
        elif key == "list":
            self.selected, self.focus = None, "list"

    def on_key(self, desk: Desktop, key: str, mods: frozenset[str]) -> None:
        if self.focus == "rename":
            if key == "enter":
                self.commit_rename(desk)
            elif key == "escape":
                self.renaming, self.focus = None, "list"
            elif key == "v" and mods == {"ctrl"}:
                self.rename_edit.type(desk.clipboard.split("\n")[0])
            else:
                self.rename_edit.key(key, mods)
            return
        if self.focus == "address":
            if key == "enter":
                if not self.navigate(desk, self.address.text.strip()):
                    self.focus = "list"  # real Explorer shows an error box; we just give up
            elif key == "escape":
                self.focus = "list"
            elif key == "v" and mods == {"ctrl"}:
                self.address.type(desk.clipboard.split("\n")[0])
            else:
                self.address.key(key, mods)
            return
        names = self.entries(desk)
        if key == "n" and mods == {"ctrl", "shift"}:
            self.new_folder(desk)
        elif key == "f2" and self.selected:
            self.start_rename(self.selected)
        elif key == "delete":
            self.delete_selected(desk)
        elif key == "enter" and self.selected:
            self.open_item(desk, self.selected)
        elif key in ("down", "up") and names:
            i = names.index(self.selected) if self.selected in names else -1
            i = min(len(names) - 1, i + 1) if key == "down" else max(0, i - 1)
            self.selected = names[i]
        elif key in ("home", "end") and names:
            self.selected = names[0] if key == "home" else names[-1]
        elif key == "a" and mods == {"ctrl"}:
            pass  # multi-selection is not simulated
        elif key == "l" and mods == {"ctrl"} or key == "d" and mods == {"alt"}:
            self.focus, self.address = "address", EditState(self.folder, all_selected=True)

    def on_text(self, desk: Desktop, text: str) -> None:
        if self.focus == "rename":
            self.rename_edit.type(text)
        elif self.focus == "address":
            self.address.type(text)
        else:
            # Type-to-select: jump to the first entry starting with the typed character.
            for name in self.entries(desk):
                if name.lower().startswith(text.lower()):
                    self.selected = name
                    break


def open_explorer(desk: Desktop, folder: str) -> Explorer:
    """Open a new Explorer window on a folder."""
    win = Explorer(desk.new_wid(), desk.cascade_rect(900, 620, 120, 40), folder)
    win.navigate(desk, folder)
    desk.add_window(win)
    return win
