# SPDX-License-Identifier: MIT
"""A slow upstream for the nginx tests: answers "ok" after ?s= seconds.

    python3 slow_upstream.py PORT_FILE MARK_DIR

Listens on a free loopback port, written to PORT_FILE.  A request with
?mark=NAME first creates MARK_DIR/in.NAME (a test waits for it: the
request reached the upstream), then sleeps ?s= seconds and answers; a
client gone by then is ignored.
"""
import http.server
import sys
import time
import urllib.parse


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if "mark" in q:
            open(sys.argv[2] + "/in." + q["mark"][0], "w").close()
        time.sleep(float(q.get("s", ["0"])[0]))
        body = b"ok\n"
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
open(sys.argv[1], "w").write(str(srv.server_address[1]))
srv.serve_forever()
