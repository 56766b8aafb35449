#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from the inputs of the
existing tests: the sanitiser's archives (service/src/workspace/sanitize/tests), the
policies and hosts of shared-policy/tests/evaluator.rs and host.rs, the frames of
sandbox-helper/src/protocol.rs, the pages and edits of sandbox-helper/src/ops/text.rs, and the
request shapes of egress-gateway/tests/proxy.rs. Deterministic; small (well under 1 MB).

    python3 fuzz/gen-corpus.py      # rewrites fuzz/corpus/
"""
import bz2, gzip, hashlib, io, json, lzma, os, shutil, struct, tarfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# === sanitize: (name, type, data-or-target, mode) as in the sanitiser tests' `archive()` ===

F, D, L, H, C, B, P = (tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                       tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)


def archive(members, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, data, mode in members:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode, 0
            if kind in (L, H):
                info.linkname = data
                t.addfile(info)
            else:
                raw = data.encode()
                info.size = len(raw) if kind == F else 0
                t.addfile(info, io.BytesIO(raw) if kind == F else None)
    # tarfile pads to 10 KiB records; the sanitiser stops at the first zero block anyway.
    return buf.getvalue().rstrip(b"\0") + b"\0" * (1024 + (-len(buf.getvalue().rstrip(b"\0")) % 512))


SANITIZE = [
    [("/etc/passwd", F, "x", 0o644)],
    [("../evil", F, "x", 0o644)],
    [("a/../../evil", F, "x", 0o644)],
    [("./", D, "", 0o755), ("./a.txt", F, "hi", 0o644)],
    [("d/", D, "", 0o700), ("d/f", F, "x", 0o600)],
    [("d/", D, "", 0o700), ("d/plain", F, "x", 0o400), ("d/exec", F, "x", 0o700)],
    [("s", F, "x", 0o6755), ("t/", D, "", 0o1777)],
    [("f", F, "x", 0o644), ("hard", H, "f", 0o644), ("dev", C, "", 0o644),
     ("blk", B, "", 0o644), ("fifo", P, "", 0o644)],
    [("a/b/c.txt", F, "x", 0o644)],
    [("f", F, "first", 0o644), ("f", F, "second", 0o644), ("f", D, "", 0o755)],
    [("docs/readme", F, "x", 0o644), ("docs/link", L, "readme", 0o777),
     ("top", L, "docs/../docs/readme", 0o777)],
    [("abs", L, "/etc/passwd", 0o777), ("up", L, "../outside", 0o777),
     ("a/deep", L, "../../outside", 0o777), ("empty", L, "", 0o777)],
    [("a/b", L, "..", 0o777), ("c", L, "a/b/../z", 0o777)],
    [("c", L, "a/b/../z", 0o777), ("a/b", L, "..", 0o777)],
    [("d/", D, "", 0o755), ("link", L, "d", 0o777), ("link/f", F, "through", 0o644),
     ("link", F, "over", 0o644), ("d", L, "x", 0o777)],
    [("f", F, "x", 0o644), ("f/g", F, "y", 0o644)],
    [("a", F, "", 0o644), ("b", F, "", 0o644), ("c", F, "", 0o644)],
]


def sanitize_seeds():
    for members in SANITIZE:
        write("sanitize", b"\0" + archive(members))
    # GNU long names and links, PAX path/linkpath/size records (the roundtrip proptest's styles).
    long = "n" * 300
    write("sanitize", b"\0" + archive([(long, F, "data", 0o644), ("l0", L, long, 0o777)],
                                       tarfile.GNU_FORMAT))
    write("sanitize", b"\0" + archive([("p/" + long, F, "pax", 0o644), ("lp", L, "p/" + long, 0o777)],
                                       tarfile.PAX_FORMAT))
    write("sanitize", b"\0" + archive([("/".join("abcdefgh"), F, "deep", 0o644)], tarfile.GNU_FORMAT))
    plain = archive([("a.txt", F, "hello", 0o644), ("dir/b.txt", F, "world\n" * 20, 0o644)])
    # Every compression the sanitiser detects (zstd's tool may be absent: its magic, then junk).
    write("sanitize", b"\0" + gzip.compress(plain, mtime=0))
    write("sanitize", b"\0" + bz2.compress(plain))
    write("sanitize", b"\0" + lzma.compress(plain, format=lzma.FORMAT_XZ))
    write("sanitize", b"\0" + b"\x28\xb5\x2f\xfd" + plain[:64])
    # Odd read sizes (k = 3: 1, 7 and 200 bytes).
    write("sanitize", bytes([3, 1, 7, 200]) + plain)
    write("sanitize", b"\0" + b"this is not a tar archive at all" * 20)


# === policy: JSON \0 host \0 method \0 path (shared-policy/tests/evaluator.rs, docs) ===

POLICIES = [
    {"policy": {"default": "allow"}},
    {"policy": {"default": "deny", "rules": []}},
    {"policy": {"rules": [{"host": "*github.com"}, {"host": "*.gitlab.com"}, {"host": "gitlab.com"},
                          {"host": "*.example.com"}]}},
    {"policy": {"default": "allow", "rules": [{"host": "[2001:db8::1]", "methods": ["GET"]},
                                              {"host": "10.0.0.5", "methods": ["GET"]},
                                              {"host": "::ffff:10.0.0.5", "methods": ["POST"]}]}},
    {"policy": {"rules": [{"host": "[ab].test", "methods": ["GET"]}]}},
    {"policy": {"rules": [{"host": "api.example.com:443"}]}},
    {"policy": {"rules": [{"host": "gitlab.test", "paths": ["/api/v4/projects/**"], "inject": "gl",
                           "methods": ["get", "POST"]}]},
     "secrets": {"gl": {"header": "PRIVATE-TOKEN", "value": "glpat-x"}}},
    {"policy": {"rules": [{"host": "a.test", "paths": ["/api/*"]}]}},
    {"policy": {"mode": "shadow", "rules": [{"host": "a.test"}]}},
    {"policy": {"rules": [{"host": "a.test", "methods": []}]}},
    {"policy": {"default": "deny", "intercept": "credentialed",
                "rules": [{"host": "api.github.com", "methods": ["GET"], "inject": "gh"},
                          {"host": "*.pypi.org"}]},
     "secrets": {"gh": {"header": "Authorization", "value": "Bearer t"}}, "version": "v7"},
    {"secrets": {"s": {"header": "X", "value": ["tok-123"]}}},
    {"secrets": {"s": {"header": "Host", "value": "x"}}},
    {"secrets": {"s": {"header": "X", "value": "a\r\nb"}}},
    {"policy": {"rules": None}, "secrets": None},
    {"policy": {"rules": [{"host": "bücher.example"}, {"host": "*.XN--BCHER-KVA.example."}]}},
]
QUERIES = [("github.com", "GET", "/"), ("api.github.com:443", "post", "/repos/x/y/issues"),
           ("gitlab.test", "GET", "/api/v4/projects/1"), ("gitlab.test", "GET", "/api/v4/../x"),
           ("[2001:db8::1]", "GET", "/"), ("10.0.0.5:80", "DELETE", "/a%2fb"),
           ("bücher.example", "GET", "/")]


def policy_seeds():
    for i, doc in enumerate(POLICIES):
        q = QUERIES[i % len(QUERIES)]
        write("policy", json.dumps(doc).encode() + b"\0" + "\0".join(q).encode())
    write("policy", b'{"policy": {"default": "allow"}')  # a strict prefix never parses
    write("policy", b"not json")


# === host (shared-policy/src/host.rs tests, evaluator.rs spellings) ===

HOSTS = ["GitHub.COM", "github.com.", "bücher.example", "under_score.test", "127.0.0.1", "[::1]",
         "::FFFF:127.0.0.1", "", ".", "a b.test", "a..b", "127.1", "0x7f.1", "a/b", "exa%mple.com",
         "example.com:443", "[::1]:8443", "::1", "10.0.0.1:80", "example.com:0", "example.com:x",
         "example.com:70000", "[::1]x", "[2001:0db8::0001]", "2001:DB8:0:0::1", "xn--bcher-kva.example",
         "ＥＸＡＭＰＬＥ．com", "a。b", "-a.test", "a-.test"]


def host_seeds():
    for h in HOSTS:
        write("host", h)


# === frame: k sizes, then frames (sandbox-helper/src/protocol.rs tests) ===

def frame(fid, kind, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return struct.pack(">IIB", len(payload) + 5, fid, kind) + payload


def frame_seeds():
    s = frame(7, 1, '{"op":"ping"}') + frame(8, 3, b"") + frame(0xFFFFFFFF, 2, b"\xab" * 300)
    write("frame", b"\0" + s)
    write("frame", bytes([3, 1, 3, 9]) + s)
    write("frame", b"\0" + struct.pack(">I", 16 * 1024 * 1024 + 6))  # oversize
    write("frame", b"\0" + bytes([0, 0, 0, 4, 0, 0, 0, 1]))  # short
    write("frame", b"\0" + s[:20])  # truncated
    reqs = [
        {"op": "run", "commands": ["true"], "fail_fast": True, "timeout_ms": None, "output_cap": 5,
         "workdir": "/workspace/repo", "env": [["A", "b"]]},
        {"op": "read", "path": "/workspace/a"},
        {"op": "grep", "pattern": "x", "path": "/workspace", "glob": "*.rs", "prune": [".git"]},
        {"op": "edit", "path": "/workspace/a", "old": "a", "new": "b", "replace_all": True},
        {"op": "extract", "dest": "/workspace/repo"},
        {"op": "write", "path": "/workspace/n", "mode": 420},
    ]
    write("frame", b"\0" + b"".join(frame(i + 1, 1, json.dumps(r)) for i, r in enumerate(reqs)))
    events = [{"type": "ready", "protocol": 1, "version": "0.1.0", "pid": 7},
              {"type": "started", "index": 0},
              {"type": "finished", "index": 1, "exit_code": 2, "omitted": 0, "timed_out": False}]
    resps = [{"ok": {}}, {"error": {"kind": "bad_request", "message": "x"}},
             {"ok": {"files": 1, "dirs": 0, "symlinks": 0, "bytes": 5, "skipped": 0}}]
    write("frame", b"\0" + b"".join(frame(0, 5, json.dumps(e)) for e in events)
          + b"".join(frame(3, 6, json.dumps(r)) for r in resps))
    # Protocol 4: a split run's STDERR frames, a watch and its events, a process's events.
    reqs4 = [
        {"op": "run", "commands": ["echo a >&2"], "split": True},
        {"op": "watch", "path": "/workspace/repo", "recursive": True},
        {"op": "proc", "request": {"action": "events", "process_id": "job-1", "after": 3,
                                   "wait_ms": 10, "max_bytes": 65536}},
        {"op": "proc", "request": {"action": "signal", "process_id": "job-1", "signal": "TERM"}},
        {"op": "proc", "request": {"action": "start", "command": "x", "workdir": "/", "max_live": 1,
                                   "buffer_bytes": 64, "process_id": "a.b", "tag": "t"}},
    ]
    events4 = [{"type": "armed", "watches": 2},
               {"type": "change", "change": "create", "path": "/workspace/a",
                "entry": {"name": "a", "path": "/workspace/a", "type": "file", "size": 1, "mode": 420,
                          "permissions": "-rw-r--r--", "owner": "root", "group": "root", "mtime": 0,
                          "symlink_target": None}},
               {"type": "overflow"}]
    resps4 = [{"ok": {"events": [{"type": "start", "seq": 1, "pid": 9}, {"type": "stderr", "seq": 2, "len": 3},
                                 {"type": "end", "seq": 3, "exit_code": 143, "signal": "TERM"}],
                      "last_seq": 3}},
              {"error": {"kind": "gone", "message": "x"}}]
    write("frame", b"\0" + b"".join(frame(i + 1, 1, json.dumps(r)) for i, r in enumerate(reqs4))
          + frame(1, 7, b"err") + b"".join(frame(2, 5, json.dumps(e)) for e in events4)
          + b"".join(frame(3, 6, json.dumps(r)) for r in resps4))


# === read_pager: limit, repeat, 4 read sizes, body (sandbox-helper/src/ops/text.rs tests) ===

def pager_seeds():
    for limit, body in [(0, b"a\nb\nc\nd\n"), (2, b"a\nb\nc\nd\n"), (10, b"x\r\ny"), (1, b""),
                        (10, b"\xff\x00ab"), (5, "héllo\nwörld\n".encode()), (3, b"no newline")]:
        write("read_pager", bytes([limit, 0, 0, 0, 0, 0]) + body)
    write("read_pager", bytes([0, 0, 2, 1, 3, 0]) + "héllo".encode())  # UTF-8 split across reads
    # Past the 512000-byte page: 1000-byte lines repeated (1 + 12*12*8 = 1153 times).
    write("read_pager", bytes([0, 12, 0, 0, 0, 0]) + b"x" * 999 + b"\n")
    write("read_pager", bytes([3, 16, 0, 0, 0, 0]) + b"y" * 600)  # one huge line


# === edit_replace: flags, text \0 old \0 new (text.rs edit_rules) ===

def edit_seeds():
    for flags, text, old, new in [(0, "a b a", "b", "c"), (1, "a b a", "a", "c"), (0, "a b a", "a", "c"),
                                  (0, "abc", "x", "y"), (0, "l1\r\nl2\r\n", "l1\nl2", "m1\nm2"),
                                  (0, "end", "end\n", "x"), (0, "end end", "end\n", "x"),
                                  (1, "a\r\nb\nc\r\n", "\r\n", "\n"), (0, "héllo wörld", "wö", "wo")]:
        write("edit_replace", bytes([flags]) + "\0".join([text, old, new]).encode())


# === request_head: mode, [CONNECT authority \n], HTTP/1.1 stream (egress-gateway/tests/proxy.rs) ===

def head_seeds():
    plain = [
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
        b"GET http://example.com:8080/a?b=c HTTP/1.1\r\nHost: example.com:8080\r\nConnection: keep-alive, x-drop\r\nX-Drop: 1\r\nProxy-Authorization: Basic eA==\r\n\r\n",
        b"POST http://example.com/x HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 3\r\n\r\nabc",
        b"GET http://[::1]/ HTTP/1.1\r\nHost: [::1]:80\r\nTE: trailers\r\nUpgrade: h2c\r\n\r\n",
        b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n\r\n",
        b"GET /-/health/ HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"GET http://10.0.0.1/ HTTP/1.1\r\n\r\nGET http://Example.COM./ HTTP/1.1\r\nHost: example.com\r\n\r\n",
    ]
    for i, s in enumerate(plain):
        write("request_head", bytes([(i % 4) << 1]) + s)
    mitm = [
        b"example.com:443\nGET /repos HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer mine\r\n\r\n",
        b"api.test:443\nPOST /api/v4/x HTTP/1.1\r\nHost: api.test:443\r\nConnection: private-token\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"example.com:443\nGET https://example.com/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        b"[::1]:8443\nTRACE / HTTP/1.1\r\nHost: [::1]:8443\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    ]
    for i, s in enumerate(mitm):
        write("request_head", bytes([1 | ((i % 4) << 1)]) + s)


if __name__ == "__main__":
    shutil.rmtree(ROOT, ignore_errors=True)
    sanitize_seeds()
    policy_seeds()
    host_seeds()
    frame_seeds()
    pager_seeds()
    edit_seeds()
    head_seeds()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ROOT) for f in fs)
    print(f"wrote {sum(len(fs) for _, _, fs in os.walk(ROOT))} seeds, {total} bytes, to {ROOT}")
