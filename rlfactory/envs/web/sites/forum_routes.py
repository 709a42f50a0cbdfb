"""The forum's pages, with Postmill-like paths (WebArena's "reddit"): `/forums`, `/f/<forum>[/new|/top]`,
`/f/<forum>/<post id>/<slug>`, `/user/<name>`, `/submit/<forum>`, `/post/<id>/edit`, `/search?q=`.

Voting, commenting (on a post or as a reply to a comment), submitting and editing posts act as the episode's
logged-in user (user 1). Left out: comment votes, deleting, moderation, subscriptions.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from rlfactory.envs.web.sites import html as h
from rlfactory.envs.web.sites.context import bad, base, episode_db, int_param, see_other, text_param
from rlfactory.envs.web.sites.forum_data import ME
from rlfactory.envs.web.sites.shop_data import slugify

SITE = "Chatter"
PER_PAGE = 25
POSTS = ("SELECT p.id, p.title, p.created_at, p.edited_at, p.body, p.user_id, u.username, f.name AS forum, "
         "f.title AS forum_title, COALESCE((SELECT SUM(value) FROM votes v WHERE v.post_id = p.id), 0) AS score, "
         "(SELECT COUNT(*) FROM comments c WHERE c.post_id = p.id) AS n_comments "
         "FROM posts p JOIN users u ON u.id = p.user_id JOIN forums f ON f.id = p.forum_id")
ORDERS = {"hot": "score / (1.0 + (julianday('2026-12-01') - julianday(p.created_at)) / 30.0) DESC, p.id DESC",
          "new": "p.created_at DESC, p.id DESC", "top": "score DESC, p.id DESC"}


def post_path(root: str, post) -> str:
    return f"{root}/f/{post['forum']}/{post['id']}/{slugify(post['title'])[:60]}"


def user_link(root: str, name: str) -> str:
    return h.link(f"{root}/user/{name}", name)


def forum_link(root: str, row) -> str:
    return h.link(f"{root}/f/{row['forum']}", row["forum_title"])


def forum_page(request: Request, title: str, body: str, *, query: str = "") -> HTMLResponse:
    root = base(request, "forum")
    with episode_db(request, "forum") as db:
        me = db.execute("SELECT username FROM users WHERE id=?", (ME,)).fetchone()[0]
    nav = [(f"{root}/", "Home"), (f"{root}/forums", "Forums"), (f"{root}/user/{me}", f"Profile ({me})")]
    return HTMLResponse(h.page(title, SITE, f"{root}/", nav, body, search_action=f"{root}/search", query=query,
                               message=request.query_params.get("msg", "")[:200]))


def _post_list(root: str, rows: list) -> str:
    items = "".join(f"<li><article>{h.link(post_path(root, r), r['title'])} <p>Score: {r['score']} | Submitted by "
                    f"{user_link(root, r['username'])} in "
                    f"{forum_link(root, r)} on {r['created_at']} | "
                    f"{h.link(post_path(root, r), str(r['n_comments']) + ' comments')}</p></article></li>"
                    for r in rows)
    return f"<ol>{items}</ol>" if rows else "<p>No posts here.</p>"


def _paged(request: Request, where: str, args: list, order: str, here: str, params: dict | None = None) -> str:
    page = int_param(request.query_params.get("page"), "page", default=1, lo=1, hi=10**4)
    with episode_db(request, "forum") as db:
        total = db.execute(f"SELECT COUNT(*) FROM posts p WHERE {where}", args).fetchone()[0]
        rows = db.execute(f"{POSTS} WHERE {where} ORDER BY {ORDERS[order]} LIMIT ? OFFSET ?",
                          args + [PER_PAGE, (page - 1) * PER_PAGE]).fetchall()
    pages = max(1, -(-total // PER_PAGE))
    params = params or {}
    nav = ([h.link(h.url(here, **params, page=page - 1), "Previous page")] if page > 1 else []) + \
          ([h.link(h.url(here, **params, page=page + 1), "Next page")] if page < pages else [])
    return (f"<p>{total} posts</p>{_post_list(base(request, 'forum'), rows)}"
            f"<p>Page {page} of {pages} {' '.join(nav)}</p>")


def home(request: Request) -> HTMLResponse:
    return forum_page(request, "Home", "<h1>Hot posts</h1>" + _paged(request, "1", [], "hot",
                                                                       f"{base(request, 'forum')}/"))


def forums(request: Request) -> HTMLResponse:
    root = base(request, "forum")
    with episode_db(request, "forum") as db:
        rows = db.execute("SELECT f.name, f.title, f.description, COUNT(p.id) FROM forums f LEFT JOIN posts p "
                          "ON p.forum_id = f.id GROUP BY f.id ORDER BY f.name").fetchall()
    items = "".join(f"<li>{h.link(f'{root}/f/{n}', t)} - {h.esc(d)} ({c} posts)</li>" for n, t, d, c in rows)
    return forum_page(request, "Forums", f"<h1>All forums</h1><ul>{items}</ul>")


def forum(request: Request) -> HTMLResponse:
    root, name = base(request, "forum"), request.path_params["forum"]
    order = request.path_params.get("order", "hot")
    if order not in ORDERS:
        raise HTTPException(404, f"No listing {order!r}: use hot, new or top.")
    with episode_db(request, "forum") as db:
        f = db.execute("SELECT * FROM forums WHERE name=?", (name,)).fetchone()
    if f is None:
        raise HTTPException(404, f"No forum {name!r}.")
    here = f"{root}/f/{name}" + ("" if order == "hot" else f"/{order}")
    tabs = " ".join(h.link(f"{root}/f/{name}" + ("" if o == "hot" else f"/{o}"), o.title()) if o != order
                    else f"<strong>{o.title()}</strong>" for o in ORDERS)
    body = (f"<h1>{h.esc(f['title'])}</h1><p>{h.esc(f['description'])}</p><p>Sort by: {tabs}</p>"
            f"<p>{h.link(f'{root}/submit/{name}', 'Submit a new post')}</p>"
            + _paged(request, "p.forum_id = ?", [f["id"]], order, here))
    return forum_page(request, f["title"], body)


def _comment_tree(root: str, comments: list, parent=None) -> str:
    """Nested comments, each with its own visible reply form (labelled with the commenter's name): a form folded
    into a <details> would be hidden from a browser's accessibility tree until opened."""
    items = []
    for c in (c for c in comments if c["parent_id"] == parent):
        reply = h.form(f"{root}/comment/{c['post_id']}", h.textarea("body", f"Reply to {c['username']}",
                                                                    field_id=f"reply-{c['id']}"),
                       f"Post reply to {c['username']}", hidden={"parent": c["id"]}, label=f"Reply to {c['username']}")
        items.append(f"<li><article><p>{user_link(root, c['username'])} on "
                     f"{c['created_at']}</p><div class=\"comment__body\"><p>{h.esc(c['body'])}</p></div>{reply}"
                     f"{_comment_tree(root, comments, c['id'])}</article></li>")
    return f"<ul>{''.join(items)}</ul>" if items else ""


def post(request: Request) -> HTMLResponse:
    root = base(request, "forum")
    pid = int_param(request.path_params["post"], "post")
    with episode_db(request, "forum") as db:
        p = db.execute(f"{POSTS} WHERE p.id = ? AND f.name = ?", (pid, request.path_params["forum"])).fetchone()
        if p is None:
            raise HTTPException(404, f"No post {pid} in f/{request.path_params['forum']}.")
        comments = db.execute("SELECT c.*, u.username FROM comments c JOIN users u ON u.id = c.user_id "
                              "WHERE post_id=? ORDER BY c.created_at, c.id", (pid,)).fetchall()
        mine = db.execute("SELECT value FROM votes WHERE user_id=? AND post_id=?", (ME, pid)).fetchone()
    voted = {1: "You upvoted this post.", -1: "You downvoted this post."}.get(mine[0] if mine else 0, "")
    votes = "".join(h.form(f"{root}/vote/{pid}", "", label, hidden={"value": value})
                    for value, label in (("1", "Upvote"), ("-1", "Downvote")))
    edit = h.link(f"{root}/post/{pid}/edit", "Edit") if p["user_id"] == ME else ""
    edited = f" (edited {p['edited_at']})" if p["edited_at"] else ""
    author = h.link(f"{root}/user/{p['username']}", p["username"])
    # Postmill's class names, so locators written for WebArena's reddit find the same parts here.
    body = (f"<article class=\"submission__inner\"><h1 class=\"submission__title\">{h.esc(p['title'])}</h1>"
            f"<p>Submitted by {author} in "
            f"{forum_link(root, p)} on {p['created_at']}{edited}</p>"
            f"<p>Score: {p['score']}</p><p>{voted}</p>{votes}<div class=\"submission__body\"><p>{h.esc(p['body'])}</p>"
            f"</div>{edit}</article>"
            f"<section aria-label=\"Comments\"><h2>{p['n_comments']} comments</h2>"
            + h.form(f"{root}/comment/{pid}", h.textarea("body", "Comment"), "Post comment", label="Comment")
            + _comment_tree(root, comments) + "</section>")
    return forum_page(request, p["title"], body)


def _post_or_404(db, pid: int):
    p = db.execute(f"{POSTS} WHERE p.id = ?", (pid,)).fetchone()
    if p is None:
        raise HTTPException(404, f"No post {pid}.")
    return p


async def vote(request: Request):
    pid = int_param(request.path_params["post"], "post")
    value = int_param((await request.form()).get("value"), "vote", lo=-1, hi=1)
    if value == 0:
        raise bad("A vote is 1 (up) or -1 (down).")
    with episode_db(request, "forum") as db:
        p = _post_or_404(db, pid)
        mine = db.execute("SELECT value FROM votes WHERE user_id=? AND post_id=?", (ME, pid)).fetchone()
        if mine and mine[0] == value:  # voting the same way again takes the vote back, as on Reddit
            db.execute("DELETE FROM votes WHERE user_id=? AND post_id=?", (ME, pid))
        else:
            db.execute("INSERT OR REPLACE INTO votes VALUES (?,?,?)", (ME, pid, value))
    return see_other(post_path(base(request, "forum"), p))


async def comment(request: Request):
    pid = int_param(request.path_params["post"], "post")
    form = await request.form()
    body = text_param(form, "body", "the comment", max_len=10000)
    parent = int_param(form.get("parent"), "parent comment") if form.get("parent") else None
    with episode_db(request, "forum") as db:
        p = _post_or_404(db, pid)
        if parent is not None and not db.execute("SELECT 1 FROM comments WHERE id=? AND post_id=?",
                                                 (parent, pid)).fetchone():
            raise HTTPException(404, f"No comment {parent} on post {pid}.")
        db.execute("INSERT INTO comments (post_id, user_id, parent_id, body, created_at) VALUES "
                   "(?,?,?,?,'2026-12-01 12:00')", (pid, ME, parent, body))
    return see_other(h.url(post_path(base(request, "forum"), p), msg="Your comment was posted."))


async def submit(request: Request):
    root, name = base(request, "forum"), request.path_params["forum"]
    with episode_db(request, "forum") as db:
        f = db.execute("SELECT * FROM forums WHERE name=?", (name,)).fetchone()
    if f is None:
        raise HTTPException(404, f"No forum {name!r}.")
    if request.method == "POST":
        form = await request.form()
        title = text_param(form, "title", "Title", max_len=300)
        text = text_param(form, "body", "Body", max_len=20000, required=False)
        with episode_db(request, "forum") as db:
            pid = db.execute("INSERT INTO posts (forum_id, user_id, title, body, created_at) VALUES "
                             "(?,?,?,?,'2026-12-01 12:00')", (f["id"], ME, title, text)).lastrowid
            p = _post_or_404(db, pid)
        return see_other(h.url(post_path(root, p), msg="Your post was submitted."))
    fields = h.textbox("title", "Title") + h.textarea("body", "Body")
    return forum_page(request, "Submit", f"<h1>Submit a new post to {h.esc(f['title'])}</h1>"
                      + h.form(f"{root}/submit/{name}", fields, "Create submission", label="New post"))


async def edit(request: Request):
    root, pid = base(request, "forum"), int_param(request.path_params["post"], "post")
    with episode_db(request, "forum") as db:
        p = _post_or_404(db, pid)
    if p["user_id"] != ME:
        raise HTTPException(403, "You can only edit your own posts.")
    if request.method == "POST":
        form = await request.form()
        title = text_param(form, "title", "Title", max_len=300)
        text = text_param(form, "body", "Body", max_len=20000, required=False)
        with episode_db(request, "forum") as db:
            db.execute("UPDATE posts SET title=?, body=?, edited_at='2026-12-01 12:00' WHERE id=?", (title, text, pid))
            p = _post_or_404(db, pid)
        return see_other(h.url(post_path(root, p), msg="Your changes were saved."))
    fields = h.textbox("title", "Title", p["title"]) + h.textarea("body", "Body", p["body"])
    return forum_page(request, "Edit post", "<h1>Edit post</h1>"
                      + h.form(f"{root}/post/{pid}/edit", fields, "Save changes", label="Edit post"))


def user(request: Request) -> HTMLResponse:
    root, name = base(request, "forum"), request.path_params["name"]
    with episode_db(request, "forum") as db:
        u = db.execute("SELECT * FROM users WHERE username=?", (name,)).fetchone()
        if u is None:
            raise HTTPException(404, f"No user {name!r}.")
        rows = db.execute(f"{POSTS} WHERE p.user_id = ? ORDER BY p.created_at DESC, p.id DESC", (u["id"],)).fetchall()
        n_comments = db.execute("SELECT COUNT(*) FROM comments WHERE user_id=?", (u["id"],)).fetchone()[0]
    body = (f"<h1>{h.esc(name)}</h1><p>Joined {u['joined']}</p><p>{len(rows)} submissions, {n_comments} comments</p>"
            f"<h2>Submissions</h2>{_post_list(root, rows)}")
    return forum_page(request, name, body)


def search(request: Request) -> HTMLResponse:
    q = request.query_params.get("q", "").strip()
    if len(q) > 200:
        raise bad("The search text is too long (at most 200 characters).")
    words = q.split() or [""]
    where = " AND ".join("p.title LIKE ? ESCAPE '\\'" for _ in words)
    args = ["%" + w.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for w in words]
    body = f"<h1>Search results for: '{h.esc(q)}'</h1>" + _paged(
        request, where, args, "new", f"{base(request, 'forum')}/search", {"q": q})
    return forum_page(request, f"Search: {q}", body, query=q)


ROUTES = [
    Route("/", home), Route("/forums", forums), Route("/search", search), Route("/f/{forum}", forum),
    Route("/f/{forum}/{post:int}/{slug}", post), Route("/f/{forum}/{post:int}", post),
    Route("/f/{forum}/{order:str}", forum), Route("/vote/{post}", vote, methods=["POST"]),
    Route("/comment/{post}", comment, methods=["POST"]), Route("/submit/{forum}", submit, methods=["GET", "POST"]),
    Route("/post/{post}/edit", edit, methods=["GET", "POST"]), Route("/user/{name}", user),
]
