"""nsqadmin's stylesheet, script and icon: files in the package's ``assets`` folder, served under ``/static/``.

They are read with :func:`pkgutil.get_data`, which reads a package's data
files wherever the package was loaded from: a checkout, an installed wheel
(``setup.cfg`` lists ``assets/*`` as package data) or the single-file
``.pyz`` (a zip, which ``scripts/build_pyz`` fills with every file of the
package).  No build step and no CDN: the files are served as they are.

Pages pass the script its settings as ``data-`` attributes of ``<body>``
(see :mod:`.pages`), never as generated code.
"""

import pkgutil

ASSET_TYPES = {
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def load_assets():
    """``{name: (content type, bytes)}`` of every asset, read from the package; an asset missing is an error."""
    assets = {}
    for name, content_type in ASSET_TYPES.items():
        data = pkgutil.get_data(__package__, "assets/" + name)
        if data is None:
            raise FileNotFoundError("nsqadmin asset %s is not in the package" % name)
        assets[name] = (content_type, data)
    return assets
