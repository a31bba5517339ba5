# SPDX-License-Identifier: MIT
"""An ASGI middleware (Starlette, FastAPI, any ASGI app) that decides each
HTTP request with a Limiter and sends the standard fields: RateLimit-Policy
and RateLimit on every response, 429 with Retry-After when denied, 503
when the store failed and the limiter denies (docs/python.md).

    app.add_middleware(RateLimitMiddleware, limiter=limiter)

With an AsyncLimiter on redis_async_store the decision never blocks the
event loop; a Limiter on the memory or shared-memory store answers at once.
"""

import ratelimit


def client_address(scope):
    """The default key: the client's address (the ASGI scope's client)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimitMiddleware:
    """RateLimitMiddleware(app, limiter, key=client_address, permits=1):
    `key(scope)` names the request's key (str or bytes; None: not limited),
    `permits` what it costs."""

    def __init__(self, app, limiter, key=client_address, permits=1):
        self.app = app
        self.limiter = limiter
        self.key = key
        self.permits = permits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        key = self.key(scope)
        if key is None:
            return await self.app(scope, receive, send)
        if isinstance(self.limiter, ratelimit.AsyncLimiter):
            d = await self.limiter.check(key, self.permits)
        else:
            d = self.limiter.check(key, self.permits)
        status, fields = self.limiter.headers(d)
        extra = [(k.lower().encode(), v.encode()) for k, v in fields.items()]
        if status:
            body = b"Too Many Requests\n" if status == 429 else \
                b"Service Unavailable\n"
            await send({"type": "http.response.start", "status": status,
                        "headers": extra + [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return None

        async def send_with_fields(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        return await self.app(scope, receive, send_with_fields)
