"""The web tests' three users (viewer, operator, admin): their tokens, names and the Users the app is given."""
from __future__ import annotations

from sits.control_plane.web.users import Users, token_sha256

TOKENS = {"viewer": "viewer-token-0123456789", "operator": "operator-token-0123456789",
          "admin": "admin-token-0123456789"}
NAMES = {"viewer": "vera", "operator": "otto", "admin": "ada"}


def app_users() -> Users:
    return Users.from_dict({"users": [{"name": NAMES[r], "role": r, "token_sha256": token_sha256(t)}
                                      for r, t in TOKENS.items()]})
