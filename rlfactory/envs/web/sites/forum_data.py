"""The forum's SQLite schema and its content, generated deterministically from a seed (nothing downloaded).

12 sub-forums, 80 users, 600 posts (unique titles) with comments (some replies to comments) and votes from other
users. User 1 is the episode's logged-in user: they own a few posts and have cast no votes, so voting, commenting,
posting and editing tasks all start from a known state. Left out: moderation, subscriptions, private messages.
"""
from __future__ import annotations

import random
import sqlite3

SCHEMA = """
CREATE TABLE forums (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, title TEXT NOT NULL,
                     description TEXT NOT NULL);
CREATE TABLE users (id INTEGER PRIMARY KEY, username TEXT UNIQUE NOT NULL, joined TEXT NOT NULL);
CREATE TABLE posts (id INTEGER PRIMARY KEY, forum_id INTEGER NOT NULL REFERENCES forums(id),
                    user_id INTEGER NOT NULL REFERENCES users(id), title TEXT NOT NULL, body TEXT NOT NULL,
                    created_at TEXT NOT NULL, edited_at TEXT);
CREATE TABLE comments (id INTEGER PRIMARY KEY, post_id INTEGER NOT NULL REFERENCES posts(id),
                       user_id INTEGER NOT NULL REFERENCES users(id), parent_id INTEGER REFERENCES comments(id),
                       body TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE votes (user_id INTEGER NOT NULL REFERENCES users(id), post_id INTEGER NOT NULL REFERENCES posts(id),
                    value INTEGER NOT NULL CHECK (value IN (-1, 1)), PRIMARY KEY (user_id, post_id));
CREATE INDEX posts_forum ON posts(forum_id);
CREATE INDEX posts_user ON posts(user_id);
CREATE INDEX comments_post ON comments(post_id);
CREATE INDEX votes_post ON votes(post_id);
"""

# forum name -> (title, things people post about)
FORUMS = {
    "gardening": ("Gardening", ["tomatoes", "compost", "raised beds", "roses", "herbs", "seedlings", "mulch"]),
    "cooking": ("Cooking", ["sourdough", "cast iron pans", "curry", "knife skills", "risotto", "dumplings", "stock"]),
    "cycling": ("Cycling", ["gravel bikes", "saddles", "tubeless tyres", "commuting", "chain wax", "bike lights"]),
    "books": ("Books", ["fantasy series", "audiobooks", "poetry", "book clubs", "classics", "sci-fi novels"]),
    "photography": ("Photography", ["prime lenses", "film cameras", "night shots", "tripods", "editing", "portraits"]),
    "movies": ("Movies", ["film scores", "director's cuts", "documentaries", "cinema trips", "sequels", "remakes"]),
    "hiking": ("Hiking", ["trail shoes", "day packs", "water filters", "maps", "ridge walks", "hut trips"]),
    "diy": ("DIY", ["drywall", "cordless drills", "shelving", "tiling", "paint", "workbenches", "insulation"]),
    "boardgames": ("Board Games", ["co-op games", "deck builders", "game nights", "card sleeves", "party games"]),
    "astronomy": ("Astronomy", ["telescopes", "meteor showers", "star charts", "eclipses", "dark skies", "Jupiter"]),
    "coffee": ("Coffee", ["grinders", "espresso", "pour-over", "cold brew", "roasting", "milk frothing"]),
    "running": ("Running", ["marathons", "running shoes", "intervals", "trail races", "recovery", "cadence"]),
}
PATTERNS = ["What are your favourite {t}?", "Beginner question about {t}", "My first month with {t}",
            "Are {t} overrated?", "Tips for {t} on a budget", "Unpopular opinion: {t} in {m}",
            "Help: problems with {t}", "Show and tell: {t} this {m}", "Best advice you got about {t}",
            "Weekly thread on {t} ({m})", "Is it worth upgrading my {t}?", "Lessons learned from {t}"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
ADJECTIVES = ["quiet", "rusty", "lucky", "brave", "sleepy", "clever", "mellow", "swift", "curious", "sunny",
              "dusty", "gentle", "wild", "tiny", "grumpy", "happy"]
ANIMALS = ["falcon", "otter", "badger", "heron", "lynx", "panda", "gecko", "moose", "raven", "walrus", "koala",
           "bison", "puffin", "ferret"]
BODIES = ["I've been thinking about {t} for a while and would love to hear what this community does.",
          "Started with {t} last {m}. Here is what worked and what did not.",
          "Long-time lurker, first post. Any recommendations on {t}?",
          "Spent the weekend on {t}. Pictures and notes below; questions welcome."]
COMMENTS = ["Great post, thanks for sharing!", "I had the same problem with {t}.",
            "Have you tried asking at a local club?", "Strongly disagree, {t} changed everything for me.",
            "Following this thread.",
            "Could you post an update next {m}?", "This is the way.", "Same here, {t} are underrated.",
            "Check the wiki first, it covers {t} well.", "Thanks, this helped a lot."]
N_USERS = 80
N_POSTS = 600
ME = 1  # the logged-in user of every episode
MY_POSTS = 8


def _date(rng: random.Random) -> str:
    return f"2026-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"


def populate(conn: sqlite3.Connection, seed: int) -> None:
    """Create the schema and fill it from `seed` (one transaction)."""
    rng = random.Random(f"forum-{seed}")
    conn.executescript(SCHEMA)
    for i, (name, (title, _)) in enumerate(FORUMS.items(), start=1):
        conn.execute("INSERT INTO forums VALUES (?,?,?,?)", (i, name, title, f"Everything about {title.lower()}."))
    usernames: list[str] = []
    while len(usernames) < N_USERS:
        name = f"{rng.choice(ADJECTIVES)}_{rng.choice(ANIMALS)}{rng.randint(1, 99)}"
        if name not in usernames:
            usernames.append(name)
    conn.executemany("INSERT INTO users VALUES (?,?,?)",
                     [(i, u, f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
                      for i, u in enumerate(usernames, start=1)])
    titles: set[str] = set()
    forum_things = list(FORUMS.values())
    for n in range(N_POSTS):
        forum_id = rng.randint(1, len(FORUMS))
        things = forum_things[forum_id - 1][1]
        title = ""
        while not title or title in titles:
            t, m = rng.choice(things), rng.choice(MONTHS)
            title = rng.choice(PATTERNS).format(t=t, m=m)
        titles.add(title)
        author = ME if n % (N_POSTS // MY_POSTS) == 7 else rng.randint(2, N_USERS)
        pid = conn.execute("INSERT INTO posts (forum_id, user_id, title, body, created_at) VALUES (?,?,?,?,?)",
                           (forum_id, author, title, rng.choice(BODIES).format(t=t, m=m), _date(rng))).lastrowid
        comment_ids: list[int] = []
        for _ in range(rng.choice([0, 0, 1, 2, 3, 4, 5, 7, 9])):
            parent = rng.choice(comment_ids) if comment_ids and rng.random() < 0.3 else None
            cid = conn.execute("INSERT INTO comments (post_id, user_id, parent_id, body, created_at) "
                               "VALUES (?,?,?,?,?)", (pid, rng.randint(2, N_USERS), parent,
                                                      rng.choice(COMMENTS).format(t=t, m=m), _date(rng))).lastrowid
            comment_ids.append(cid)
        lean = rng.uniform(0.2, 0.95)
        voters = rng.sample(range(2, N_USERS + 1), rng.randint(0, 30))
        conn.executemany("INSERT INTO votes VALUES (?,?,?)",
                         [(v, pid, 1 if rng.random() < lean else -1) for v in voters])
    conn.commit()
