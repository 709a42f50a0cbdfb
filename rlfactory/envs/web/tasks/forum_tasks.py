"""The forum's task templates (WebArena "reddit" style): reading posts, users and listings, voting, commenting,
replying, submitting and editing posts, each with its instances drawn from the seed database and its plan.

Instances whose plan would be ambiguous (two commenters of the same name on a post, tied top scores) are skipped.
"""
from __future__ import annotations

import sqlite3

from rlfactory.envs.web.sites.forum_data import FORUMS, ME
from rlfactory.envs.web.sites.forum_routes import POSTS
from rlfactory.envs.web.sites.shop_data import slugify
from rlfactory.envs.web.tasks.template import (
    SEARCH,
    Instance,
    Template,
    check,
    click,
    includes,
    page_has,
    pick,
    stop,
    type_,
    url_is,
    via,
)

R = "reddit"
OPEN = SEARCH + [click("link", "{title}")]
LISTING = [click("link", "Forums"), click("link", "{forum_title}")]
REPLIES = ["Thanks for posting this!", "I agree with every word.", "Could you share more details?",
           "This saved me a lot of time.", "Interesting, I had not thought of that.", "Bookmarked for later."]


def _posts(db: sqlite3.Connection) -> list[dict]:
    return [dict(r) for r in db.execute(f"{POSTS} ORDER BY p.id")]


def _url(p: dict) -> str:
    return f"__REDDIT__/f/{p['forum']}/{p['id']}/{slugify(p['title'])[:60]}"


def _one(p: dict, **more) -> dict:
    return {"title": p["title"], "query": p["title"], **more}


def comment_count(db, rng):
    return [Instance(_one(p), via(includes(str(p["n_comments"])), _url(p)), {"answer": str(p["n_comments"])})
            for p in pick(rng, _posts(db))]


def author_of(db, rng):
    return [Instance(_one(p), via(includes(p["username"]), _url(p)), {"answer": p["username"]})
            for p in pick(rng, _posts(db))]


def score_of(db, rng):
    return [Instance(_one(p), via(includes(str(p["score"])), _url(p)), {"answer": str(p["score"])})
            for p in pick(rng, _posts(db))]


def forum_of(db, rng):
    return [Instance(_one(p), via(includes(p["forum_title"]), _url(p)), {"answer": p["forum_title"]})
            for p in pick(rng, _posts(db))]


def date_of(db, rng):
    return [Instance(_one(p), via(includes(p["created_at"]), _url(p)), {"answer": p["created_at"]})
            for p in pick(rng, _posts(db))]


def _vote(value: int):
    def make(db, rng):
        return [Instance(_one(p), page_has(_url(p), ["You upvoted this post." if value == 1 else
                                                     "You downvoted this post."],
                                           [check(R, "SELECT COALESCE((SELECT value FROM votes WHERE user_id=? AND "
                                                     "post_id=?), 0)", [ME, p["id"]], value)]))
                for p in pick(rng, _posts(db))]
    return make


def comment_on(db, rng):
    out = []
    for p in pick(rng, _posts(db)):
        text = f"{rng.choice(REPLIES)} ({rng.randint(100, 999)})"
        out.append(Instance(_one(p, text=text), page_has(_url(p), [text], [check(
            R, "SELECT EXISTS(SELECT 1 FROM comments WHERE post_id=? AND user_id=? AND parent_id IS NULL AND body=?)",
            [p["id"], ME, text], 1)])))
    return out


def reply_to(db, rng):
    out = []
    for p in _posts(db):
        rows = db.execute("SELECT c.id, u.username FROM comments c JOIN users u ON u.id = c.user_id WHERE post_id=?",
                          (p["id"],)).fetchall()
        names = [r[1] for r in rows]
        for cid, name in rows:
            if names.count(name) == 1 and name != p["username"]:
                out.append((p, cid, name))
                break
    instances = []
    for p, cid, name in pick(rng, out):
        text = f"@{name} {rng.choice(REPLIES)} ({rng.randint(100, 999)})"
        instances.append(Instance(_one(p, user=name, text=text), page_has(_url(p), [text], [check(
            R, "SELECT EXISTS(SELECT 1 FROM comments WHERE post_id=? AND user_id=? AND parent_id=? AND body=?)",
            [p["id"], ME, cid, text], 1)])))
    return instances


def new_post(db, rng):
    out = []
    for i in range(30):
        name = rng.choice(sorted(FORUMS))
        forum_id, forum_title = db.execute("SELECT id, title FROM forums WHERE name=?", (name,)).fetchone()
        thing = rng.choice(FORUMS[name][1])
        title = f"Looking for advice on {thing} (#{rng.randint(1000, 9999)})"
        body = f"I am new to {thing}. What should I know before starting?"
        out.append(Instance({"forum_title": forum_title, "title": title, "body": body}, page_has(
            "func:reddit_get_post_url('__last_url__')", [title, body], [check(
                R, "SELECT EXISTS(SELECT 1 FROM posts WHERE forum_id=? AND user_id=? AND title=? AND body=?)",
                [forum_id, ME, title, body], 1)])))
    return out


def edit_title(db, rng):
    me = db.execute("SELECT username FROM users WHERE id=?", (ME,)).fetchone()[0]
    out = []
    for p in [p for p in _posts(db) if p["user_id"] == ME]:
        new = f"[Update] {p['title']}"
        out.append(Instance({"old": p["title"], "new": new}, page_has(
            "last", [new], [check(R, "SELECT title FROM posts WHERE id=?", [p["id"]], new)]), {"me": me}))
    return out


def _users(db) -> list[dict]:
    return [dict(r) for r in db.execute(
        "SELECT u.username, COUNT(p.id) AS n, MIN(p.title) AS a_title FROM users u JOIN posts p ON p.user_id = u.id "
        "GROUP BY u.id ORDER BY u.id")]


def user_url(db, rng):
    return [Instance({"user": u["username"]}, url_is(f"__REDDIT__/user/{u['username']}"),
                     {"query": u["a_title"], "title": u["a_title"]}) for u in pick(rng, _users(db))]


def user_post_count(db, rng):
    return [Instance({"user": u["username"]}, includes(str(u["n"])), {"query": u["a_title"], "answer": str(u["n"])})
            for u in pick(rng, _users(db))]


def _forums(db) -> list[dict]:
    return [dict(r) for r in db.execute("SELECT * FROM forums ORDER BY id")]


def url_top(db, rng):
    return [Instance({"forum_title": f["title"]}, url_is(f"__REDDIT__/f/{f['name']}/top")) for f in _forums(db)]


def top_title(db, rng):
    out = []
    posts = _posts(db)
    for f in _forums(db):
        ranked = sorted((p for p in posts if p["forum"] == f["name"]), key=lambda p: -p["score"])
        if len(ranked) > 1 and ranked[0]["score"] != ranked[1]["score"]:
            out.append(Instance({"forum_title": f["title"]}, includes(ranked[0]["title"]),
                                {"answer": ranked[0]["title"]}))
    return out


def newest_title(db, rng):
    out = []
    posts = _posts(db)
    for f in _forums(db):
        ranked = sorted((p for p in posts if p["forum"] == f["name"]), key=lambda p: p["created_at"], reverse=True)
        if len(ranked) > 1 and ranked[0]["created_at"] != ranked[1]["created_at"]:
            out.append(Instance({"forum_title": f["title"]}, includes(ranked[0]["title"]),
                                {"answer": ranked[0]["title"]}))
    return out


TEMPLATES = [
    Template(101, "forum_comment_count", R, "How many comments does the post \"{{title}}\" have?",
             OPEN + [stop("{answer}")], comment_count),
    Template(102, "forum_author", R, "Who submitted the post \"{{title}}\"?", OPEN + [stop("{answer}")], author_of),
    Template(103, "forum_score", R, "What is the score of the post \"{{title}}\"?", OPEN + [stop("{answer}")],
             score_of),
    Template(104, "forum_which_forum", R, "In which forum was the post \"{{title}}\" submitted?",
             OPEN + [stop("{answer}")], forum_of),
    Template(105, "forum_post_date", R, "When was the post \"{{title}}\" submitted?", OPEN + [stop("{answer}")],
             date_of),
    Template(106, "forum_upvote", R, "Upvote the post \"{{title}}\".", OPEN + [click("button", "Upvote"), stop()],
             _vote(1)),
    Template(107, "forum_downvote", R, "Downvote the post \"{{title}}\".",
             OPEN + [click("button", "Downvote"), stop()], _vote(-1)),
    Template(108, "forum_comment", R, "Comment \"{{text}}\" on the post \"{{title}}\".",
             OPEN + [type_("textbox", "Comment", "{text}"), click("button", "Post comment"), stop()], comment_on),
    Template(109, "forum_reply", R, "On the post \"{{title}}\", reply \"{{text}}\" to the comment by {{user}}.",
             OPEN + [type_("textbox", "Reply to {user}", "{text}"), click("button", "Post reply to {user}"), stop()],
             reply_to),
    Template(110, "forum_new_post", R, "Submit a post to the {{forum_title}} forum titled \"{{title}}\" with the "
             "text \"{{body}}\".", LISTING + [click("link", "Submit a new post"), type_("textbox", "Title", "{title}"),
                                              type_("textbox", "Body", "{body}"),
                                              click("button", "Create submission"), stop()], new_post),
    Template(111, "forum_edit_title", R, "Change the title of my post \"{{old}}\" to \"{{new}}\".",
             [click("link", "Profile ({me})"), click("link", "{old}"), click("link", "Edit"),
              type_("textbox", "Title", "{new}"), click("button", "Save changes"), stop()], edit_title),
    Template(112, "forum_url_user", R, "Open the profile page of the user {{user}}.",
             SEARCH + [click("link", "{user}"), stop()], user_url),
    Template(113, "forum_user_post_count", R, "How many posts has the user {{user}} submitted?",
             SEARCH + [click("link", "{user}"), stop("{answer}")], user_post_count),
    Template(114, "forum_url_top", R, "Show the top-scoring posts of the {{forum_title}} forum.",
             LISTING + [click("link", "Top"), stop()], url_top),
    Template(115, "forum_top_title", R, "What is the title of the highest-scoring post in the {{forum_title}} forum?",
             LISTING + [click("link", "Top"), stop("{answer}")], top_title),
    Template(116, "forum_newest_title", R, "What is the title of the newest post in the {{forum_title}} forum?",
             LISTING + [click("link", "New"), stop("{answer}")], newest_title),
]
