"""A news-site HTTP server on 127.0.0.1 for the article fetcher's tests, benchmark and demo.

``NewsServer(pages={"/a.html": "<html>…"}, root=None, latency_s=0.0)`` serves HTML pages from a dict
(path → str/bytes) and/or a directory, adds ``latency_s`` before every response (the benchmark's
200 ms per response), and offers hostile endpoints, each of which the fetcher must survive in
bounded time:

==========================  ====================================================================
path                        what the client gets
==========================  ====================================================================
``/hostile/huge``           200 text/html, Content-Length 50 MB, streamed until the client quits
``/hostile/huge-chunked``   the same 50 MB, chunked, no Content-Length (only a streaming cap helps)
``/hostile/gzip-bomb``      200 text/html, ``Content-Encoding: gzip``, ~130 KB inflating to 128 MB
``/hostile/slow-drip``      200 text/html, Content-Length 1 MB, 64 bytes every ``drip_interval_s``
``/hostile/stall``          nothing for ``stall_s``, then a page (a read timeout)
``/hostile/loop-a``         302 → ``/hostile/loop-b`` → 302 → ``/hostile/loop-a`` …
``/hostile/cookie-wall``    302 to itself with a Set-Cookie, then (with the cookie) a page: not a loop
``/hostile/chain/<n>``      302 → ``/hostile/chain/<n+1>``, forever (too many redirects)
``/hostile/to-metadata``    302 → ``http://169.254.169.254/latest/meta-data/``
``/hostile/to-file``        302 → ``file:///etc/passwd``
``/hostile/bad-gzip``       200 text/html, ``Content-Encoding: gzip``, a body that is not gzip
``/hostile/brotli``         200 text/html, ``Content-Encoding: br`` although we never ask for it
``/hostile/pdf``            200 application/pdf
``/hostile/no-type-binary`` 200 without Content-Type, binary body (sniffed: not HTML)
``/hostile/no-type-html``   200 without Content-Type, an HTML body (sniffed: HTML)
``/hostile/retry-after/…``  429 with ``Retry-After: retry_after_s`` the first ``retry_after_times``
                            requests of each such path, then a page
``/hostile/retry-after-long``  429 with ``Retry-After: 7200``, always
``/hostile/500``            500, always
``/hostile/404``            404
``/hostile/reset``          the connection reset (RST) before any response
``/hostile/reset-mid-body`` headers and half the body, then RST
``/redirect?to=<url>``      302 → ``<url>`` (e.g. another server, or ``/private/…``)
``/robots.txt``             ``robots_txt`` (default: ``Disallow: /private/``) with
                            ``robots_status`` (default 200); ``robots_txt=None`` → 404
``/private/…``              a page, but disallowed by the default robots.txt
==========================  ====================================================================

With ``sites=True`` the server also plays every news site of a generated mirror (the demo): a
request whose ``Host`` is a ``*.example`` name gets that site's page for the path, made from the
URL alone by ``site_page`` (same URL, same bytes), and ``/robots.txt`` is the site's own
(``site_robots``). The pages are what news sites send: head metadata, a cookie banner, navigation,
breadcrumbs, share buttons, the article, related links, a newsletter box, reader comments and a
footer, so the extractor has boilerplate to remove. A fixed share of URLs fail the way real ones
do (``site_page`` lists them), so the fetch ledger and the filters show real numbers.

Every request is logged (``srv.requests``: time, method, path, status, bytes, host, user_agent);
``srv.count(path)`` counts requests for one path, and ``srv.max_in_flight`` is the largest number
of requests handled at once (to check per-host limits and the benchmark's real concurrency).
"""

from __future__ import annotations

import functools
import hashlib
import random
import socket
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from testbed.local import LocalServer, resolve_under

DEFAULT_ROBOTS = "User-agent: *\nDisallow: /private/\n"
METADATA_URL = "http://169.254.169.254/latest/meta-data/"
HUGE_BYTES = 50 * 2**20
BOMB_BYTES = 128 * 2**20
DRIP_BYTES = 2**20
_FILLER = (b"<p>" + b"lorem ipsum dolor sit amet " * 37 + b"</p>\n") * 64  # ~64 KB of HTML


def page_html(title: str, paragraphs: int = 5) -> bytes:
    body = "".join(f"<p>{title}: paragraph {i} of a generated news article.</p>" for i in range(paragraphs))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><article><h1>{title}</h1>{body}</article></body></html>"
    ).encode()


# --- The news sites of a generated mirror (NewsServer(sites=True)) --------------------------------

SITE_SUFFIX = ".example"  # the generator's news sites (RFC 2606: never a real host)
# How article URLs fail, per mille of URLs, decided by the URL's hash: link rot (404), a PDF where
# a page was expected, an overloaded server (503, retried on the ledger's schedule), a slow
# server, and a paywall whose teaser is too short to keep. The rest are whole articles.
SITE_FAILURES = (("gone", 40), ("pdf", 15), ("unavailable", 5), ("slow", 10), ("paywall", 30))
SLOW_S = (0.4, 1.2)  # seconds before a slow server answers
# Sites whose robots.txt also keeps crawlers out of their opinion pages.
ROBOTS_NO_OPINION = frozenset({"www.frontierledger.example", "www.citizenvoice.example", "www.morgenblatt.example"})


@dataclass(frozen=True)
class SitePage:
    status: int
    content_type: str | None
    body: bytes
    delay_s: float = 0.0


def site_robots(host: str) -> str:
    extra = "Disallow: /opinion/\n" if host in ROBOTS_NO_OPINION else ""
    return f"User-agent: *\nDisallow: /private/\n{extra}\nSitemap: http://{host}/sitemap.xml\n"


_SENTENCES = {
    "en": """{who} of {A} said on {weekday} that talks with {B} would continue despite the disagreement over {topic}.
Officials in {city} confirmed that a delegation from {B} had arrived late in the evening.
The meeting lasted more than {n} hours, according to two people familiar with the discussions.
The foreign ministry of {A} described the exchange as frank but constructive and promised a written statement.
Analysts noted that relations between the two countries have swung sharply since the spring.
Neither side released details of the draft, which diplomats said runs to about {n2} pages.
Opposition lawmakers in {A} criticised the government for moving too quickly on {topic}.
"We are not going to negotiate under pressure," a senior adviser told reporters outside the ministry.
Markets reacted calmly, with the national currency closing almost unchanged against the dollar.
Human rights groups urged both governments to put the protection of civilians at the centre of any agreement.
The {org} said it was monitoring the situation closely and called on all parties to show restraint.
Earlier this month, {B} recalled its ambassador for consultations after a dispute over {topic}.
Residents of {city} interviewed by this newspaper expressed little hope that the talks would change their daily lives.
A spokesperson for the {org} declined to comment on the reports when contacted on {weekday}.
Trade between {A} and {B} reached roughly {n3} billion dollars last year, according to official figures.
The announcement came hours after security forces reported a series of incidents near the border.
Several newspapers in {B} carried the story on their front pages on {weekday} morning.
Experts cautioned that any deal would need parliamentary approval, which could take months.
The government has faced mounting criticism at home over rising prices and a slowing economy.
In a televised address, {who2} promised that the country would defend its interests by every lawful means.
Diplomats from three neighbouring states are expected to join the next round of discussions.
It was not immediately clear whether the new measures would take effect before the end of the month.
The defence ministry said {n4} soldiers had been placed on alert as a precaution.
Aid agencies warned that supplies of food, fuel and medicine in the region were running dangerously low.
Supporters of the agreement argue that it would ease tensions that have simmered for years.
Critics say the text leaves key questions about enforcement and verification unanswered.
The two leaders last met in person at a regional summit in {city2} in the autumn.
A joint statement is expected once negotiators have settled the remaining points of difference.
Police said {n} people were detained during protests outside the parliament building.
Both the European Union and the United Nations welcomed the resumption of dialogue.
Officials from {B} insisted that their position on {topic} had not changed in any way.
The talks were briefly interrupted when a fire alarm forced staff to leave the building.""",
    "es": """El ministro de Asuntos Exteriores de {A} afirmó el {weekday} que las conversaciones con {B} seguirán adelante.
Según fuentes diplomáticas, la reunión se prolongó durante más de {n} horas en un ambiente tenso.
La oposición criticó al gobierno por actuar con demasiada prisa en un asunto tan delicado.
Los mercados reaccionaron con calma y la moneda nacional cerró prácticamente sin cambios.
Varias organizaciones humanitarias pidieron a ambos gobiernos que protejan a la población civil.
Los vecinos de {city} consultados por este periódico se mostraron escépticos sobre el resultado.
El portavoz del gobierno evitó hacer declaraciones sobre el contenido del borrador.
Los analistas recuerdan que las relaciones entre los dos países se han deteriorado desde la primavera.""",
    "fr": """Le ministre des Affaires étrangères de {A} a déclaré {weekday} que les discussions avec {B} allaient se poursuivre.
Selon des sources diplomatiques, la réunion a duré plus de {n} heures dans une atmosphère tendue.
L'opposition a reproché au gouvernement d'avoir agi trop vite sur un dossier aussi sensible.
Les marchés ont réagi avec calme et la monnaie nationale a terminé la séance presque inchangée.
Plusieurs organisations humanitaires ont appelé les deux gouvernements à protéger les civils.
Les habitants de {city} interrogés par notre journal se disent sceptiques quant à l'issue des pourparlers.
Le porte-parole du gouvernement s'est refusé à tout commentaire sur le contenu du projet.
Les analystes rappellent que les relations entre les deux pays se sont nettement dégradées depuis le printemps.""",
    "de": """Der Außenminister von {A} erklärte am {weekday}, die Gespräche mit {B} würden fortgesetzt.
Nach Angaben von Diplomaten dauerte das Treffen mehr als {n} Stunden und verlief angespannt.
Die Opposition warf der Regierung vor, in einer so heiklen Frage zu schnell gehandelt zu haben.
Die Märkte reagierten gelassen, die Landeswährung schloss nahezu unverändert.
Mehrere Hilfsorganisationen forderten beide Regierungen auf, die Zivilbevölkerung zu schützen.
Die von unserer Zeitung befragten Einwohner von {city} zeigten sich skeptisch.
Ein Regierungssprecher wollte sich zum Inhalt des Entwurfs nicht äußern.
Beobachter erinnern daran, dass sich die Beziehungen beider Länder seit dem Frühjahr deutlich verschlechtert haben.""",
}
_FILL = {
    "A": "the United States|China|Russia|Ukraine|Israel|the United Kingdom|France|Germany|India|Iran|Pakistan|Turkey|Japan|Canada|Mexico|Brazil|Nigeria|Egypt|Australia|South Korea",
    "who": "The foreign minister|The prime minister|A government spokesperson|The president|The deputy foreign minister",
    "who2": "the president|the prime minister|the head of government|the interior minister",
    "topic": "border security|fishing rights|energy prices|the detention of two journalists|a stalled trade agreement|water rights|visa rules|a disputed election|military exercises",
    "city": "the capital|Geneva|Vienna|Istanbul|Doha|Brussels|New York|Nairobi|Singapore|Oslo",
    "org": "United Nations|European Union|African Union|Red Cross|World Health Organization|International Monetary Fund",
    "weekday": "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday",
}
_FILL = {k: v.split("|") for k, v in _FILL.items()}
_UI = {  # interface strings per site language (the boilerplate around the article)
    "en": ("Home", "Most read", "Related articles", "Comments", "Subscribe", "Read more", "All rights reserved"),
    "es": (
        "Portada",
        "Lo más leído",
        "Artículos relacionados",
        "Comentarios",
        "Suscríbete",
        "Leer más",
        "Todos los derechos reservados",
    ),
    "fr": (
        "Accueil",
        "Les plus lus",
        "À lire aussi",
        "Commentaires",
        "S'abonner",
        "Lire la suite",
        "Tous droits réservés",
    ),
    "de": (
        "Startseite",
        "Meistgelesen",
        "Mehr zum Thema",
        "Kommentare",
        "Abonnieren",
        "Weiterlesen",
        "Alle Rechte vorbehalten",
    ),
}
_COMMENTS = (
    "Finally some good news, let's hope it lasts.",
    "Same story every year. Nothing will change.",
    "Does anyone know where the full text of the statement is published?",
    "Great reporting, thank you.",
    "This paper never mentions the other side of the story.",
    "First!",
    "Who pays for all of this? We do.",
    "I was there last week and the situation is much worse than described.",
)


def _filled(template: str, rng: random.Random) -> str:
    values = {k: rng.choice(v) for k, v in _FILL.items()}
    values["B"] = rng.choice([c for c in _FILL["A"] if c != values["A"]])
    values["city2"] = rng.choice([c for c in _FILL["city"] if c != values["city"]])
    values.update(n=rng.randint(2, 14), n2=rng.randint(12, 90), n3=rng.randint(2, 240), n4=rng.randint(200, 9000))
    text = template.format(**values)
    return text[0].upper() + text[1:]


def _site_name(host: str) -> str:
    name = host.removeprefix("www.").removesuffix(SITE_SUFFIX)
    return " ".join(part.capitalize() for part in name.split("-")) if "-" in name else name.capitalize()


def _title(path: str) -> str:
    slug = path.rstrip("/").rsplit("/", 1)[-1]
    words = [w for w in slug.split("-") if not w.isdigit()]
    return " ".join(words).capitalize() or "News"


def _published(path: str) -> str:
    parts = path.strip("/").split("/")
    return "-".join(parts[1:4]) if len(parts) >= 5 and parts[1].isdigit() else "2024-01-01"


def _boilerplate_page(host: str, path: str, lang: str, article: str, rng: random.Random) -> bytes:
    """A news site's page around ``article`` (HTML of the article's paragraphs)."""
    home, most_read, related, comments, subscribe, _, rights = _UI[lang]
    site, title, day = _site_name(host), escape(_title(path)), _published(path)
    section = path.strip("/").split("/", 1)[0]
    sections = "".join(
        f'<li><a href="/{s}/">{s.capitalize()}</a></li>'
        for s in ("news", "world", "politics", "business", "opinion", "sport", "culture")
    )
    links = "".join(
        f'<li><a href="/news/{day.replace("-", "/")}/story-{rng.randrange(10**6)}">'
        f"{escape(_filled(rng.choice(_SENTENCES['en'].splitlines()), rng)[:70])}</a></li>"
        for _ in range(5)
    )
    thread = "".join(
        f'<li class="comment"><div class="comment-author">reader{rng.randrange(9999)}</div>'
        f'<p class="comment-body">{escape(rng.choice(_COMMENTS))}</p></li>'
        for _ in range(rng.randint(0, 6))
    )
    page = f"""<!DOCTYPE html>
<html lang="{lang}"><head><meta charset="utf-8"><title>{title} | {site}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta property="og:title" content="{title}"><meta property="og:site_name" content="{site}">
<meta property="article:published_time" content="{day}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z">
<link rel="canonical" href="http://{host}{escape(path)}"><link rel="stylesheet" href="/static/site.css">
<script>window.dataLayer = window.dataLayer || []; dataLayer.push({{"section": "{section}"}});</script>
</head><body>
<div id="cookie-banner" class="cookie-consent"><p>We use cookies to improve your experience. <button>Accept all</button> <button>Settings</button></p></div>
<header class="site-header"><a class="logo" href="/">{site}</a><nav class="main-nav"><ul><li><a href="/">{home}</a></li>{sections}</ul></nav>
<a class="subscribe" href="/subscribe">{subscribe}</a></header>
<nav class="breadcrumb"><a href="/">{home}</a> › <a href="/{section}/">{section.capitalize()}</a></nav>
<main><article class="story"><h1>{title}</h1>
<div class="byline">{site} staff · <time datetime="{day}">{day}</time></div>
<div class="share"><a href="#">Facebook</a> <a href="#">X</a> <a href="#">Email</a></div>
{article}
</article>
<aside class="related"><h2>{related}</h2><ul>{links}</ul></aside>
<div class="newsletter"><h3>{subscribe}</h3><p>Get the day's top stories in your inbox every morning.</p><form><input type="email"><button>{subscribe}</button></form></div>
<section id="comments" class="comments"><h2>{comments}</h2><ol>{thread}</ol></section>
</main>
<aside class="most-read"><h2>{most_read}</h2><ol>{links}</ol></aside>
<footer class="site-footer"><ul><li><a href="/about">About us</a></li><li><a href="/contact">Contact</a></li><li><a href="/privacy">Privacy</a></li></ul>
<p>© 2024 {site}. {rights}.</p></footer>
</body></html>
"""
    return page.encode()


def site_page(host: str, path: str, languages: dict[str, str]) -> SitePage:
    """The page of ``http://host/path`` on a generated news site (``languages``: domain → language
    of its pages): deterministic, so every fetch of a URL gets the same answer."""
    digest = hashlib.md5(f"{host}{path}".encode()).digest()
    rng = random.Random(digest)
    bucket = int.from_bytes(digest[:4], "big") % 1000
    failure = None
    for name, per_mille in SITE_FAILURES:
        if bucket < per_mille:
            failure = name
            break
        bucket -= per_mille
    html = "text/html; charset=utf-8"
    if failure == "gone":
        return SitePage(404, html, b"<html><body><h1>Page not found</h1></body></html>")
    if failure == "pdf":
        return SitePage(200, "application/pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n" + digest * 64)
    if failure == "unavailable":
        return SitePage(503, "text/plain", b"Service temporarily unavailable\n")
    lang = languages.get(host.removeprefix("www."), "en")
    sentences = _SENTENCES[lang].splitlines()
    rng.shuffle(sentences)
    read_more = _UI[lang][5]
    if failure == "paywall":
        teaser = f"<p>{escape(_filled(sentences[0], rng))}</p>"
        box = f'<div class="paywall"><p>{_UI[lang][4]}: 1 € / week.</p></div>'
        return SitePage(200, html, _boilerplate_page(host, path, lang, teaser + box, rng))
    paragraphs, i = [], 0
    for k in range(rng.randint(5, 9)):
        take = rng.randint(2, 3)
        if i + take > len(sentences):  # no sentence twice: repeats would fail the repetition filters
            break
        paragraphs.append(f"<p>{escape(' '.join(_filled(t, rng) for t in sentences[i : i + take]))}</p>")
        i += take
        if k == 2:  # an in-article promotion, as CMSs insert them
            paragraphs.append(
                f'<p class="read-more"><strong>{read_more}:</strong> <a href="/news/">{escape(_title(path))}</a></p>'
            )
    delay = rng.uniform(*SLOW_S) if failure == "slow" else 0.0
    return SitePage(200, html, _boilerplate_page(host, path, lang, "\n".join(paragraphs), rng), delay)


@functools.lru_cache(maxsize=2)
def gzip_bomb(inflated_bytes: int = BOMB_BYTES) -> bytes:
    """A gzip member of zeros inflating to ``inflated_bytes`` (made in 1 MB steps, never held whole)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * 2**20
    out = [comp.compress(block) for _ in range(inflated_bytes // len(block))]
    out.append(comp.flush())
    return b"".join(out)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # The benchmark runs 32+ concurrent clients; the default backlog of 5 would drop connects.
    request_queue_size = 128
    news: NewsServer

    def handle_error(self, request, client_address) -> None:
        """Quiet about clients that hang up (the fetcher drops hostile responses on purpose)."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, socket.timeout)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms per response), which would swamp a 200 ms latency benchmark.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args) -> None:
        """Silenced: ``NewsServer.requests`` is the log tests read."""

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        news = self.server.news
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        entry = {
            "time": time.time(),
            "method": self.command,
            "path": path,
            "query": parts.query,
            "status": None,
            "bytes": 0,
            "host": self.headers.get("Host"),
            "user_agent": self.headers.get("User-Agent"),
        }
        news.record(entry)  # on arrival, filled in as the response goes out (see serve.py)
        news.enter()
        try:
            if news.latency_s and news.wait(news.latency_s):
                self.close_connection = True
                return
            self._route(path, parts.query, send_body, entry)
        except (TimeoutError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client gave up (as it should on hostile endpoints)
        finally:
            news.leave()

    # --- responses ---

    def _head(self, status: int, headers: dict[str, str], entry: dict) -> None:
        entry["status"] = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(
        self,
        status: int,
        data: bytes,
        content_type: str | None,
        entry: dict,
        send_body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        all_headers = {"Content-Length": str(len(data))}
        if content_type:
            all_headers["Content-Type"] = content_type
        all_headers.update(headers or {})
        self._head(status, all_headers, entry)
        if send_body:
            self.wfile.write(data)
            entry["bytes"] = len(data)

    def _redirect(self, location: str, entry: dict, send_body: bool) -> None:
        self._send(302, b"", None, entry, send_body, {"Location": location})

    def _reset(self) -> None:
        # SO_LINGER 0 turns the close into a RST.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _stream(self, total: int, entry: dict, chunked: bool, interval_s: float = 0.0, chunk: bytes = _FILLER) -> None:
        news = self.server.news
        sent = 0
        while sent < total:
            piece = chunk[: total - sent]
            if chunked:
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                self.wfile.write(piece)
            sent += len(piece)
            entry["bytes"] = sent
            if interval_s and news.wait(interval_s):
                break
            if news.stopping:
                break
        if chunked and sent >= total:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = sent < total

    def _route(self, path: str, query: str, send_body: bool, entry: dict) -> None:
        news = self.server.news
        html = "text/html; charset=utf-8"
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
        if news.sites is not None and host.endswith(SITE_SUFFIX):
            return self._site(host, path, entry, send_body)
        if path == "/robots.txt":
            if news.robots_txt is None:
                return self._send(404, b"no robots.txt\n", "text/plain", entry, send_body)
            return self._send(news.robots_status, news.robots_txt.encode(), "text/plain", entry, send_body)
        if path == "/redirect":
            target = parse_qs(query).get("to", ["/"])[0]
            return self._redirect(target, entry, send_body)
        if path.startswith("/hostile/"):
            return self._hostile(path[len("/hostile/") :], entry, send_body)
        if path.startswith("/private/"):
            return self._send(200, page_html(f"private {path}"), html, entry, send_body)
        data = news.page(path)
        if data is None:
            return self._send(404, b"not found\n", "text/plain", entry, send_body)
        self._send(200, data, html, entry, send_body)

    def _site(self, host: str, path: str, entry: dict, send_body: bool) -> None:
        news = self.server.news
        if path == "/robots.txt":
            return self._send(200, site_robots(host).encode(), "text/plain", entry, send_body)
        page = site_page(host, path, news.sites)
        if page.delay_s and news.wait(page.delay_s):
            self.close_connection = True
            return
        self._send(page.status, page.body, page.content_type, entry, send_body)

    def _hostile(self, name: str, entry: dict, send_body: bool) -> None:
        news = self.server.news
        html = "text/html; charset=utf-8"
        if name in ("huge", "huge-chunked"):
            chunked = name == "huge-chunked"
            headers = {"Content-Type": html}
            headers.update({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(HUGE_BYTES)})
            self._head(200, headers, entry)
            if send_body:
                self._stream(HUGE_BYTES, entry, chunked)
            return
        if name == "gzip-bomb":
            return self._send(200, gzip_bomb(), html, entry, send_body, {"Content-Encoding": "gzip"})
        if name == "slow-drip":
            self._head(200, {"Content-Type": html, "Content-Length": str(DRIP_BYTES)}, entry)
            if send_body:
                self._stream(DRIP_BYTES, entry, False, news.drip_interval_s, b"<p>" + b"d" * 57 + b"</p>")
            return
        if name == "stall":
            if news.wait(news.stall_s):
                self.close_connection = True
                return
            return self._send(200, page_html("stalled"), html, entry, send_body)
        if name == "cookie-wall":
            if "wall=passed" in (self.headers.get("Cookie") or ""):
                return self._send(200, page_html("behind the wall"), html, entry, send_body)
            return self._send(
                302,
                b"",
                None,
                entry,
                send_body,
                {"Location": "/hostile/cookie-wall", "Set-Cookie": "wall=passed; Path=/"},
            )
        if name == "loop-a":
            return self._redirect("/hostile/loop-b", entry, send_body)
        if name == "loop-b":
            return self._redirect("/hostile/loop-a", entry, send_body)
        if name.startswith("chain/"):
            n = int(name.split("/", 1)[1] or 0)
            return self._redirect(f"/hostile/chain/{n + 1}", entry, send_body)
        if name == "to-metadata":
            return self._redirect(METADATA_URL, entry, send_body)
        if name == "to-file":
            return self._redirect("file:///etc/passwd", entry, send_body)
        if name == "brotli":
            return self._send(200, b"\x1b\x03\x00\xf8\xa5\x10\x1c", html, entry, send_body, {"Content-Encoding": "br"})
        if name == "bad-gzip":
            return self._send(
                200, b"\x1f\x8b\x08\x00 this is not gzip at all", html, entry, send_body, {"Content-Encoding": "gzip"}
            )
        if name == "pdf":
            pdf = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n"
            return self._send(200, pdf, "application/pdf", entry, send_body)
        if name == "no-type-binary":
            return self._send(200, bytes(range(256)) * 8, None, entry, send_body)
        if name == "no-type-html":
            return self._send(200, page_html("sniffed"), None, entry, send_body)
        if name.startswith("retry-after/"):
            if news.hit(name) <= news.retry_after_times:
                return self._send(
                    429, b"slow down\n", "text/plain", entry, send_body, {"Retry-After": str(news.retry_after_s)}
                )
            return self._send(200, page_html(f"after 429 {name}"), html, entry, send_body)
        if name == "retry-after-long":
            return self._send(429, b"slow down\n", "text/plain", entry, send_body, {"Retry-After": "7200"})
        if name == "500":
            return self._send(500, b"server error\n", "text/plain", entry, send_body)
        if name == "404":
            return self._send(404, b"not found\n", "text/plain", entry, send_body)
        if name == "reset":
            return self._reset()
        if name == "reset-mid-body":
            data = page_html("cut", 400)
            self._head(200, {"Content-Type": html, "Content-Length": str(len(data))}, entry)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._reset()
        self._send(404, b"no such hostile endpoint\n", "text/plain", entry, send_body)


class NewsServer(LocalServer):
    """Serve pages and hostile endpoints on 127.0.0.1 (``with NewsServer(...) as srv``)."""

    thread_name = "news"

    def __init__(
        self,
        pages: dict[str, str | bytes] | None = None,
        root: Path | None = None,
        *,
        port: int = 0,
        latency_s: float = 0.0,
        robots_txt: str | None = DEFAULT_ROBOTS,
        robots_status: int = 200,
        retry_after_times: int = 1,
        retry_after_s: int = 1,
        drip_interval_s: float = 0.1,
        stall_s: float = 10.0,
        sites: dict[str, str] | None = None,
    ):
        self.sites = sites  # domain -> language of the generated news sites played (module docstring)
        self.pages = {p: (v.encode() if isinstance(v, str) else v) for p, v in (pages or {}).items()}
        self.root = Path(root).resolve() if root is not None else None
        self.latency_s = latency_s
        self.robots_txt = robots_txt
        self.robots_status = robots_status
        self.retry_after_times = retry_after_times
        self.retry_after_s = retry_after_s
        self.drip_interval_s = drip_interval_s
        self.stall_s = stall_s
        self._hits: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0  # most requests handled at the same time (per-host limit checks)
        super().__init__(_HTTPServer(("127.0.0.1", port), _Handler))
        self._httpd.news = self

    def url_for(self, path: str) -> str:
        return self.url + path

    def page(self, path: str) -> bytes | None:
        if path in self.pages:
            return self.pages[path]
        if self.root is None:
            return None
        target = resolve_under(self.root, path)
        return target.read_bytes() if target is not None and target.is_file() else None

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def hit(self, key: str) -> int:
        """Count a request for ``key``; the count including this one."""
        with self._lock:
            self._hits[key] = self._hits.get(key, 0) + 1
            return self._hits[key]

    def count(self, path: str) -> int:
        return sum(1 for e in self.requests if e["path"] == path)
