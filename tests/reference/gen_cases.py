#!/usr/bin/env python3
"""Writes cases.json: the tool calls whose texts agentvfs compares with Deep Agents'.

Each case names a backend ("fs": FilesystemBackend in virtual mode, "state": StateBackend),
files to create ("text", "hex", "repeat"/"times", "pieces" [[text, times], ...], "dir", "symlink", or "many" generated files),
rules, earlier steps (tool calls, or "put" to change a file behind the session's back), and the
call whose text is compared. "differs" marks a deliberate difference (TOOLS.md) and "agentvfs"
then holds agentvfs' own text. Edit this file, then run it: python3 gen_cases.py
"""
import json
import os
FIVE = {"path": "/a.txt", "text": "one\ntwo\nthree\nfour\nfive\n"}
def deny(ops, *paths): return {"operations": ops, "paths": list(paths), "mode": "deny"}
def allow(ops, *paths): return {"operations": ops, "paths": list(paths), "mode": "allow"}
R = ["read"]; W = ["write"]; RW = ["read", "write"]
cases = []
def case(name, tool, args, setup=(), rules=(), steps=(), backend="fs", differs=None, agentvfs=None):
    c = {"name": name, "backend": backend, "setup": list(setup), "rules": list(rules), "steps": list(steps), "tool": tool, "args": args}
    if differs: c["differs"] = differs
    if agentvfs is not None: c["agentvfs"] = agentvfs
    cases.append(c)
def read(p, **kw): return {"tool": "read_file", "args": {"file_path": p, **kw}}

# --- validation (§1.0)
case("validate-traversal", "read_file", {"file_path": "/a/../b"})
case("validate-tilde", "read_file", {"file_path": "~/x"})
case("validate-windows", "read_file", {"file_path": "C:\\x"})
case("validate-relative", "read_file", {"file_path": "a.txt"}, [FIVE])
case("validate-dot", "ls", {"path": "."}, [FIVE])
case("validate-empty", "ls", {"path": ""}, [FIVE])
# --- ls (§1.1)
case("ls-root", "ls", {"path": "/"}, [FIVE, {"path": "/dir/x", "text": "x"}, {"path": "/b c.txt", "text": ""}])
case("ls-sub", "ls", {"path": "/dir/"}, [{"path": "/dir/x", "text": "x"}, {"path": "/dir/sub", "dir": True}])
case("ls-empty", "ls", {"path": "/e"}, [{"path": "/e", "dir": True}])
case("ls-missing", "ls", {"path": "/nope"})
case("ls-file", "ls", {"path": "/a.txt"}, [FIVE])
case("ls-quotes", "ls", {"path": "/q"}, [{"path": "/q/it's", "text": ""}, {"path": "/q/say \"hi\"", "text": ""}, {"path": "/q/both'\"", "text": ""}, {"path": "/q/back\\slash", "text": ""}])
case("ls-hidden-dir", "ls", {"path": "/"}, [FIVE, {"path": "/secrets/k", "text": "k"}], [deny(R, "/secrets/**")])
case("ls-filtered-entries", "ls", {"path": "/d"}, [{"path": "/d/a.log", "text": ""}, {"path": "/d/b.txt", "text": ""}], [deny(R, "/d/*.log")])
case("ls-denied", "ls", {"path": "/secrets"}, [{"path": "/secrets/k", "text": "k"}], [deny(R, "/secrets")])
case("ls-dir-as-dir", "ls", {"path": "/secrets"}, [{"path": "/secrets/k", "text": "k"}], [deny(R, "/secrets/**")],
     differs="deviation 11: /secrets is judged as /secrets/", agentvfs="Error: permission denied for read on /secrets")
case("ls-pub", "ls", {"path": "/pub"}, [{"path": "/pub/a", "text": "a"}, {"path": "/priv", "text": ""}], [allow(R, "/pub/**"), deny(R, "/**")],
     differs="deviation 11: /pub is judged as /pub/", agentvfs="['/pub/a']")
case("ls-truncated", "ls", {"path": "/m"}, [{"many": {"dir": "/m", "prefix": "a_rather_long_file_name_to_fill_the_listing_quickly_", "count": 1500}}])
case("ls-dotfile", "ls", {"path": "/s"}, [{"path": "/s/.env", "text": ""}, {"path": "/s/x", "text": ""}], [deny(R, "/s/*")],
     differs="deviation 1: rules match dot-files", agentvfs="No files found")
# --- read_file (§1.2)
case("read-default", "read_file", {"file_path": "/a.txt"}, [FIVE])
case("read-window", "read_file", {"file_path": "/a.txt", "offset": 2, "limit": 2}, [FIVE])
case("read-last-page", "read_file", {"file_path": "/a.txt", "offset": 4, "limit": 2}, [FIVE])
case("read-offset-exceeds", "read_file", {"file_path": "/a.txt", "offset": 5}, [FIVE])
case("read-negative-offset", "read_file", {"file_path": "/a.txt", "offset": -1, "limit": 2}, [FIVE])
case("read-limit-zero", "read_file", {"file_path": "/a.txt", "limit": 0}, [FIVE])
case("read-limit-negative", "read_file", {"file_path": "/a.txt", "limit": -3}, [FIVE])
case("read-no-final-newline", "read_file", {"file_path": "/n.txt"}, [{"path": "/n.txt", "text": "x\ny"}])
case("read-empty", "read_file", {"file_path": "/e.txt"}, [{"path": "/e.txt", "text": ""}], backend="state")
case("read-empty-fs", "read_file", {"file_path": "/e.txt"}, [{"path": "/e.txt", "text": ""}],
     differs="FilesystemBackend renders its empty-file quirk; agentvfs follows the State/Store text",
     agentvfs="System reminder: File exists but has empty contents")
case("read-whitespace", "read_file", {"file_path": "/w.txt"}, [{"path": "/w.txt", "text": " \n\t\n"}], backend="state")
case("read-empty-limit-zero", "read_file", {"file_path": "/e.txt", "limit": 0}, [{"path": "/e.txt", "text": ""}], backend="state")
case("read-blank-window", "read_file", {"file_path": "/b.txt", "offset": 1}, [{"path": "/b.txt", "text": "a\n\n\n"}])
case("read-splitlines", "read_file", {"file_path": "/s.txt"}, [{"path": "/s.txt", "text": "a\fb\nc\u2028d\ne\n"}])
case("read-splitlines-window", "read_file", {"file_path": "/s.txt", "offset": 1, "limit": 2}, [{"path": "/s.txt", "text": "a\fb\nc\u2028d\ne\n"}])
case("read-crlf", "read_file", {"file_path": "/c.txt"}, [{"path": "/c.txt", "text": "a\r\nb\rc\r\n"}])
case("read-missing", "read_file", {"file_path": "/nope.txt"})
case("read-dir", "read_file", {"file_path": "/d"}, [{"path": "/d", "dir": True}])
case("read-not-utf8", "read_file", {"file_path": "/bin.dat"}, [{"path": "/bin.dat", "hex": "6869ff00"}])
case("read-not-utf8-cont", "read_file", {"file_path": "/bin.dat"}, [{"path": "/bin.dat", "hex": "61e28228"}])
case("read-png", "read_file", {"file_path": "/i.png"}, [{"path": "/i.png", "hex": "89504e470d0a1a0a0000"}])
case("read-jpg-upper", "read_file", {"file_path": "/i.JPG"}, [{"path": "/i.JPG", "hex": "ffd8ffe0"}])
case("read-pdf", "read_file", {"file_path": "/d.pdf"}, [{"path": "/d.pdf", "hex": "255044462d"}])
case("read-empty-png", "read_file", {"file_path": "/e.png"}, [{"path": "/e.png", "text": ""}])
case("read-midline", "read_file", {"file_path": "/big.txt"}, [{"path": "/big.txt", "repeat": "x", "times": 90000}])
case("read-midline-window", "read_file", {"file_path": "/big.txt", "offset": 1}, [{"path": "/big.txt", "pieces": [["short\n", 1], ["y", 90000], ["\nend\n", 1]]}])
case("read-truncated-lines", "read_file", {"file_path": "/long.txt"}, [{"path": "/long.txt", "repeat": "z" * 999 + "\n", "times": 100}])
case("read-truncated-unicode", "read_file", {"file_path": "/u.txt", "offset": 3, "limit": 200}, [{"path": "/u.txt", "repeat": "\u00e9\u4e2d" * 300 + "\n", "times": 200}])
case("read-truncated-negative", "read_file", {"file_path": "/long.txt", "offset": -4}, [{"path": "/long.txt", "repeat": "z" * 999 + "\n", "times": 100}])
case("read-exactly-at-cap", "read_file", {"file_path": "/cap.txt"}, [{"path": "/cap.txt", "repeat": "c", "times": 80000 - len("@@ lines 1-1 of 1 @@\n")}])
case("read-under-cap", "read_file", {"file_path": "/cap.txt"}, [{"path": "/cap.txt", "repeat": "c", "times": 79999 - len("@@ lines 1-1 of 1 @@\n")}])
case("read-denied", "read_file", {"file_path": "/secrets/key.txt"}, [{"path": "/secrets/key.txt", "text": "k"}], [deny(R, "/secrets/**")])
case("read-symlink-denied", "read_file", {"file_path": "/pub/link.txt"}, [{"path": "/secrets/key.txt", "text": "k"}, {"path": "/pub/link.txt", "symlink": "/secrets/key.txt"}], [deny(R, "/secrets/**")])
case("read-symlink-ok", "read_file", {"file_path": "/pub/link.txt"}, [{"path": "/data/f.txt", "text": "hello\n"}, {"path": "/pub/link.txt", "symlink": "../data/f.txt"}])
case("read-symlink-escape", "read_file", {"file_path": "/l"}, [{"path": "/l", "symlink": "../../../../../../../../x"}], [deny(R, "/nothing")])
case("read-dotfile-denied", "read_file", {"file_path": "/secrets/.env"}, [{"path": "/secrets/.env", "text": "k"}], [deny(R, "/secrets/**")],
     differs="deviation 1: rules match dot-files", agentvfs="Error: permission denied for read on /secrets/.env")
# --- write_file (§1.3)
case("write-new", "write_file", {"file_path": "/new/dir/f.txt", "content": "hello\n"})
case("write-new-then-read", "read_file", {"file_path": "/new/f.txt"}, steps=[{"tool": "write_file", "args": {"file_path": "/new/f.txt", "content": "x\r\ny"}}])
case("write-overwrite-unread", "write_file", {"file_path": "/a.txt", "content": "new"}, [FIVE])
case("write-dir", "write_file", {"file_path": "/d", "content": "x"}, [{"path": "/d", "dir": True}])
case("write-denied", "write_file", {"file_path": "/ro/x", "content": "x"}, rules=[deny(W, "/ro/**")])
case("write-symlink-denied", "write_file", {"file_path": "/pub/link.txt", "content": "x"}, [{"path": "/secrets/key.txt", "text": "k"}, {"path": "/pub/link.txt", "symlink": "/secrets/key.txt"}], [deny(W, "/secrets/**")])
case("write-root", "write_file", {"file_path": "/", "content": "x"}, differs="deviation 6: / cannot be overwritten",
     agentvfs="Error: permission denied for write on / (the root and route mount points cannot be overwritten)")
case("write-stale", "write_file", {"file_path": "/a.txt", "content": "mine"}, [FIVE], steps=[read("/a.txt"), {"put": {"path": "/a.txt", "text": "theirs, longer\n"}}],
     differs="deviation 4: stale writes are refused", agentvfs="Error: '/a.txt' changed since it was read; re-read the file, then retry")
# --- edit_file (§1.4)
def edit(name, text, old, new, replace_all=None, differs=None, agentvfs=None, steps=None, path="/e.txt"):
    args = {"file_path": path, "old_string": old, "new_string": new}
    if replace_all is not None: args["replace_all"] = replace_all
    case(name, "edit_file", args, [{"path": "/e.txt", "text": text}] if text is not None else [],
         steps=[read(path)] if steps is None else steps, differs=differs, agentvfs=agentvfs)
edit("edit-success", "alpha beta gamma\n", "beta", "BETA")
edit("edit-replace-all", "x y x y x\n", "x", "z", replace_all=True)
edit("edit-multiple", "x y x y x\n", "x", "z")
edit("edit-not-found", "alpha\n", "omega", "z")
edit("edit-empty-old", "alpha\n", "", "z")
edit("edit-trailing-newline", "a\nlast", "last\n", "LAST\n")
edit("edit-trailing-newline-multi", "ab ab ab", "ab\n", "AB\n")
edit("edit-missing", None, "a", "b", steps=[], path="/nope.txt")
edit("edit-crlf", "one\r\ntwo\r\n", "one\r\ntwo", "1\r\n2")
edit("edit-multiline", "def f():\n    return 1\n", "    return 1\n", "    return 2\n")
edit("edit-not-utf8", None, "a", "b", steps=[{"put": {"path": "/e.txt", "hex": "ff61"}}, read("/e.txt")])
case("edit-result", "read_file", {"file_path": "/e.txt"}, [{"path": "/e.txt", "text": "one\r\ntwo\r\nthree"}],
     steps=[read("/e.txt"), {"tool": "edit_file", "args": {"file_path": "/e.txt", "old_string": "two", "new_string": "2"}}])
edit("edit-same", "alpha\n", "alpha", "alpha", differs="deviation 5", agentvfs="Error: new_string must differ from old_string")
edit("edit-unread", "alpha\n", "alpha", "beta", steps=[], differs="deviation 4", agentvfs="Error: edit requires reading '/e.txt' first")
edit("edit-denied", "alpha\n", "alpha", "beta", steps=[])
cases[-1]["rules"] = [deny(W, "/e.txt")]
# --- delete (§1.5, §2.7)
WORK = [{"path": "/work/a.txt", "text": "a"}, {"path": "/work/notes.txt", "text": "n"}, {"path": "/work/app.log", "text": "l"},
        {"path": "/work/empty", "dir": True}, {"path": "/work/secrets/key", "text": "k"}, {"path": "/work/sub/deep/f", "text": "f"}]
def delete(name, target, rules=(), differs=None, agentvfs=None, setup=WORK):
    case(name, "delete", {"file_path": target}, setup, rules, differs=differs, agentvfs=agentvfs)
delete("delete-file", "/work/a.txt")
delete("delete-dir", "/work/sub")
delete("delete-missing", "/work/nope")
delete("delete-leaf-allowed", "/work/a.txt", [allow(W, "/work/**"), deny(W, "/**")])
delete("delete-empty-dir-denied", "/work/empty", [allow(W, "/work/**"), deny(W, "/**")])
delete("delete-subtree-denied", "/work", [deny(W, "/work/secrets/**")])
delete("delete-log-sibling", "/work/notes.txt", [deny(W, "/work/*.log")])
delete("delete-log-match", "/work/app.log", [deny(W, "/work/*.log")])
delete("delete-log-parent", "/work", [deny(W, "/work/*.log")])
delete("delete-multi", "/work", [deny(W, "/work/secrets/**", "/other/**"), deny(RW, "/**/secrets", "/work/*.log"), deny(W, "/work/secrets/**")])
delete("delete-read-deny-ignored", "/work/sub", [deny(R, "/work/sub/**")],
       differs="agentvfs hides /work/sub (deny read), so the path is not found", agentvfs="Error: '/work/sub' not found")
delete("delete-interrupt-ignored", "/work/sub", [{"operations": W, "paths": ["/work/sub/**"], "mode": "interrupt"}],
       differs="without an approver the engine refuses interrupt rules", agentvfs="Error: permission denied for write on /work/sub")
delete("delete-missing-overlap", "/work/nope", [deny(W, "/work/nope/x")])
delete("delete-ancestor-symlink", "/pub/ld/key.txt", [deny(W, "/secrets/**")],
       setup=[{"path": "/secrets/key.txt", "text": "k"}, {"path": "/pub/ld", "symlink": "/secrets"}])
delete("delete-symlink-leaf", "/pub/link.txt", [deny(W, "/secrets/**")],
       setup=[{"path": "/secrets/key.txt", "text": "k"}, {"path": "/pub/link.txt", "symlink": "/secrets/key.txt"}],
       differs="agentvfs removes the link itself, so only the link's path is judged", agentvfs="Deleted /pub/link.txt")
delete("delete-root", "/", differs="deviation 6", agentvfs="Error: permission denied for write on / (the root and route mount points cannot be deleted)")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json"), "w", encoding="utf-8") as f:
    json.dump(cases, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(len(cases))
