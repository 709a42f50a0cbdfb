"""The shop's SQLite schema and its content, generated deterministically from a seed (nothing downloaded).

16 categories of ~70 products each (>= 1,000), every product with colour options, sizes where the category has
them (clothes, shoes), a price and 0-12 reviews; one customer (the episode's logged-in user) with an address and a
history of past orders. The same seed always gives byte-identical rows (one `random.Random(seed)` drives it all).
Left out: stock levels, discounts, taxes, shipping methods and payment (checkout asks for an address only).
"""
from __future__ import annotations

import random
import sqlite3

SCHEMA = """
CREATE TABLE categories (id INTEGER PRIMARY KEY, name TEXT NOT NULL, slug TEXT UNIQUE NOT NULL,
                         sized TEXT NOT NULL DEFAULT '');
CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL, name TEXT UNIQUE NOT NULL,
                       category_id INTEGER NOT NULL REFERENCES categories(id), price_cents INTEGER NOT NULL,
                       description TEXT NOT NULL, rating REAL NOT NULL DEFAULT 0,
                       review_count INTEGER NOT NULL DEFAULT 0);
CREATE TABLE product_colours (product_id INTEGER NOT NULL REFERENCES products(id), colour TEXT NOT NULL,
                              PRIMARY KEY (product_id, colour));
CREATE TABLE product_sizes (product_id INTEGER NOT NULL REFERENCES products(id), size TEXT NOT NULL,
                            position INTEGER NOT NULL, PRIMARY KEY (product_id, size));
CREATE TABLE reviews (id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL REFERENCES products(id),
                      author TEXT NOT NULL, rating INTEGER NOT NULL, title TEXT NOT NULL, body TEXT NOT NULL,
                      created_at TEXT NOT NULL);
CREATE TABLE customer (id INTEGER PRIMARY KEY, first_name TEXT, last_name TEXT, email TEXT, phone TEXT,
                       street TEXT, city TEXT, zip TEXT, country TEXT);
CREATE TABLE cart_items (id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL REFERENCES products(id),
                         colour TEXT NOT NULL, size TEXT NOT NULL, qty INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, created_at TEXT NOT NULL, status TEXT NOT NULL,
                     total_cents INTEGER NOT NULL, ship_name TEXT NOT NULL, street TEXT NOT NULL, city TEXT NOT NULL,
                     zip TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE order_items (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id),
                          product_id INTEGER NOT NULL REFERENCES products(id), name TEXT NOT NULL,
                          colour TEXT NOT NULL, size TEXT NOT NULL, qty INTEGER NOT NULL, price_cents INTEGER NOT NULL);
CREATE INDEX products_category ON products(category_id);
CREATE INDEX reviews_product ON reviews(product_id);
"""

COLOURS = ["red", "blue", "green", "black", "white", "grey", "yellow", "navy", "pink", "brown"]
APPAREL_SIZES = ["XS", "S", "M", "L", "XL"]
SHOE_SIZES = ["6", "7", "8", "9", "10", "11", "12"]
# (name, singular noun, sizes kind, price range in dollars)
CATEGORIES = [
    ("Shirts", "Shirt", "apparel", (15, 90)), ("T-Shirts", "Tee", "apparel", (8, 45)),
    ("Hoodies", "Hoodie", "apparel", (25, 110)), ("Jackets", "Jacket", "apparel", (40, 260)),
    ("Trousers", "Trousers", "apparel", (20, 120)), ("Dresses", "Dress", "apparel", (25, 180)),
    ("Sneakers", "Sneaker", "shoe", (35, 190)), ("Boots", "Boot", "shoe", (50, 280)),
    ("Backpacks", "Backpack", "", (20, 160)), ("Watches", "Watch", "", (30, 450)),
    ("Mugs", "Mug", "", (5, 35)), ("Lamps", "Lamp", "", (15, 140)),
    ("Headphones", "Headphones", "", (15, 350)), ("Blankets", "Blanket", "", (18, 120)),
    ("Water Bottles", "Bottle", "", (6, 45)), ("Sunglasses", "Sunglasses", "", (10, 220)),
]
PRODUCTS_PER_CATEGORY = 70
BRANDS = ["Aurora", "Nordic", "Cobalt", "Juniper", "Summit", "Harbor", "Maple", "Orion", "Pioneer", "Quill",
          "Solace", "Tundra", "Vesper", "Willow", "Zephyr", "Atlas", "Beacon", "Cedar", "Drift", "Ember"]
STYLES = ["Classic", "Urban", "Trail", "Everyday", "Premium", "Lite", "Studio", "Coastal", "Alpine", "Retro",
          "Modern", "Heritage", "Active", "Soft", "Bold"]
WEAR_MATERIALS = ["Cotton", "Linen", "Wool", "Canvas", "Leather", "Fleece", "Denim", "Recycled", "Organic"]
GOODS_MATERIALS = ["Bamboo", "Ceramic", "Steel", "Aluminium", "Recycled", "Canvas", "Oak", "Glass"]
FIRST = ["Ava", "Ben", "Chloe", "Dan", "Elena", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kira", "Liam", "Maya",
         "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wes", "Yara", "Zane"]
LAST = ["Adams", "Brooks", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Hughes", "Ito", "Jensen", "Kowalski",
        "Lopez", "Moreau", "Novak", "Okafor", "Patel", "Rossi", "Silva", "Tanaka", "Weber"]
REVIEW_TITLES = {5: ["Love it", "Perfect", "Excellent quality", "Best purchase this year"],
                 4: ["Very good", "Nice, small flaws", "Good value", "Happy with it"],
                 3: ["It's okay", "Average", "Does the job", "Mixed feelings"],
                 2: ["Disappointing", "Not as pictured", "Poor fit", "Meh"],
                 1: ["Terrible", "Broke quickly", "Do not buy", "Waste of money"]}
REVIEW_BODIES = ["The {noun} arrived quickly and the {colour} looks just like the photos.",
                 "I have used this {noun} every day for a month.", "Sizing runs a little small on this {noun}.",
                 "The material feels {feel} for the price.", "Bought it as a gift; the {noun} was well packed.",
                 "Customer service answered within a day.", "Colour faded after a few washes."]
FEELS = ["sturdy", "cheap", "premium", "soft", "thin", "solid"]
STATUSES = ["Complete", "Complete", "Complete", "Canceled", "Pending", "Processing"]
CITIES = [("Springfield", "62704"), ("Riverton", "82501"), ("Lakewood", "80226"), ("Fairview", "97024"),
          ("Georgetown", "78626"), ("Madison", "53703"), ("Ashland", "97520"), ("Clinton", "52732")]
STREETS = ["Oak Street", "Maple Avenue", "Pine Road", "Cedar Lane", "Elm Drive", "Birch Court", "Willow Way"]
CUSTOMER_ORDERS = 16


def slugify(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def money(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


def _date(rng: random.Random, year: int = 2026) -> str:
    return f"{year}-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d}"


def populate(conn: sqlite3.Connection, seed: int) -> None:
    """Create the schema and fill it from `seed` (one transaction)."""
    rng = random.Random(f"shop-{seed}")
    conn.executescript(SCHEMA)
    names: set[str] = set()
    for cat_id, (cat, noun, sized, (lo, hi)) in enumerate(CATEGORIES, start=1):
        conn.execute("INSERT INTO categories VALUES (?,?,?,?)", (cat_id, cat, slugify(cat), sized))
        for _ in range(PRODUCTS_PER_CATEGORY):
            name = ""
            while not name or name in names:
                name = (f"{rng.choice(BRANDS)} {rng.choice(STYLES)} "
                        f"{rng.choice(GOODS_MATERIALS if not sized else WEAR_MATERIALS)} {noun}")
            names.add(name)
            price = rng.randint(lo * 100, hi * 100) // 10 * 10 + rng.choice([9, 0, 5])
            colours = rng.sample(COLOURS, rng.randint(1, 4))
            desc = (f"The {name} is a {rng.choice(FEELS)} {noun.lower()} from {name.split()[0]}'s "
                    f"{name.split()[1].lower()} line, made of {name.split()[2].lower()}.")
            pid = conn.execute("INSERT INTO products (sku, name, category_id, price_cents, description) "
                               "VALUES (?,?,?,?,?)", (f"SKU-{seed % 1000:03d}-{len(names):05d}", name, cat_id,
                                                      price, desc)).lastrowid
            conn.executemany("INSERT INTO product_colours VALUES (?,?)", [(pid, c) for c in colours])
            scale = APPAREL_SIZES if sized == "apparel" else SHOE_SIZES if sized == "shoe" else []
            if scale:
                start = rng.randint(0, len(scale) - 3)
                span = scale[start:start + rng.randint(3, len(scale) - start)]
                conn.executemany("INSERT INTO product_sizes VALUES (?,?,?)",
                                 [(pid, s, scale.index(s)) for s in span])
            quality = rng.uniform(1.5, 5.0)
            for _ in range(rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 10, 12])):
                stars = max(1, min(5, round(rng.gauss(quality, 0.9))))
                body = rng.choice(REVIEW_BODIES).format(noun=noun.lower(), colour=rng.choice(colours),
                                                        feel=rng.choice(FEELS))
                conn.execute("INSERT INTO reviews (product_id, author, rating, title, body, created_at) "
                             "VALUES (?,?,?,?,?,?)", (pid, f"{rng.choice(FIRST)} {rng.choice(LAST)[0]}.", stars,
                                                      rng.choice(REVIEW_TITLES[stars]), body, _date(rng, 2025)))
    refresh_ratings(conn)
    first, last = rng.choice(FIRST), rng.choice(LAST)
    city, zip_code = rng.choice(CITIES)
    street = f"{rng.randint(10, 999)} {rng.choice(STREETS)}"
    conn.execute("INSERT INTO customer VALUES (1,?,?,?,?,?,?,?,?)",
                 (first, last, f"{first.lower()}.{last.lower()}@example.com",
                  f"555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}", street, city, zip_code, "United States"))
    n_products = len(names)
    dates = sorted({_date(rng, 2025) for _ in range(CUSTOMER_ORDERS * 2)})[:CUSTOMER_ORDERS]
    for created in dates:
        items = []
        for pid in rng.sample(range(1, n_products + 1), rng.randint(1, 3)):
            name, price = conn.execute("SELECT name, price_cents FROM products WHERE id=?", (pid,)).fetchone()
            colour = rng.choice([r[0] for r in conn.execute(
                "SELECT colour FROM product_colours WHERE product_id=? ORDER BY colour", (pid,))])
            sizes = [r[0] for r in conn.execute("SELECT size FROM product_sizes WHERE product_id=? ORDER BY position",
                                                (pid,))]
            items.append((pid, name, colour, rng.choice(sizes) if sizes else "", rng.randint(1, 3), price))
        total = sum(qty * price for *_, qty, price in items)
        oid = conn.execute("INSERT INTO orders (created_at, status, total_cents, ship_name, street, city, zip, "
                           "country) VALUES (?,?,?,?,?,?,?,?)", (created, rng.choice(STATUSES), total,
                                                                 f"{first} {last}", street, city, zip_code,
                                                                 "United States")).lastrowid
        conn.executemany("INSERT INTO order_items (order_id, product_id, name, colour, size, qty, price_cents) "
                         "VALUES (?,?,?,?,?,?,?)", [(oid, *item) for item in items])
    conn.commit()


def refresh_ratings(conn: sqlite3.Connection, product_id: int | None = None) -> None:
    """Keep products.rating (mean stars, one decimal) and review_count in step with the reviews table."""
    where, args = ("WHERE p.id=?", (product_id,)) if product_id is not None else ("", ())
    conn.execute(f"""UPDATE products AS p SET
        rating = COALESCE((SELECT ROUND(AVG(rating), 1) FROM reviews r WHERE r.product_id = p.id), 0),
        review_count = (SELECT COUNT(*) FROM reviews r WHERE r.product_id = p.id) {where}""", args)
