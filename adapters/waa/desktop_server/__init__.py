"""A WAA server for a REAL Linux desktop: this product's own server, run inside the kvm
provider's `debian-desktop` guest (adapters/vms/kvm_desktop.py), never on the host.

It speaks WAA's HTTP API (notes/waa.md: the same routes, payloads, status codes and error
shapes as WAA's Flask server in a Windows VM) over a real X display: screenshots of the display,
the accessibility tree read from AT-SPI, the harness's pyautogui code run for real, real
programs launched and real files read and written. Nothing here is simulated, and nothing is
Windows: results from it are labelled "real Linux desktop" (docs/desktop.md).

Written for this product; it shares no code with WAA's or OSWorld's servers. It imports nothing
from the product outside this package, because the guest's code disk holds only this package.
"""

LABEL = "real Linux desktop (Debian 12, X11, openbox) in a QEMU VM"
"""What this server's desktop is, for /desktop/info and the provider's labels."""
