"""The shop's customer pages: cart, checkout with an address form, order history and order pages, the account
page and its edit form (Magento-like paths: `/checkout/cart/`, `/sales/order/history/`,
`/sales/order/view/order_id/<id>/`, `/customer/account/`).

The episode's customer is always logged in (WebArena starts its shop tasks logged in too). Left out: payment,
shipping methods, coupons, order cancellation.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from rlfactory.envs.web.sites import html as h
from rlfactory.envs.web.sites.context import bad, base, episode_db, int_param, see_other, text_param
from rlfactory.envs.web.sites.shop_catalog import shop_page
from rlfactory.envs.web.sites.shop_data import money

ADDRESS_FIELDS = [("ship_name", "Full name"), ("street", "Street address"), ("city", "City"), ("zip", "ZIP code"),
                  ("country", "Country")]
ACCOUNT_FIELDS = [("first_name", "First name"), ("last_name", "Last name"), ("email", "Email"), ("phone", "Phone"),
                  ("street", "Street address"), ("city", "City"), ("zip", "ZIP code"), ("country", "Country")]


async def add_to_cart(request: Request):
    form = await request.form()
    sku = str(form.get("sku", ""))
    qty = int_param(form.get("qty"), "Qty", default=1, lo=1, hi=99)
    colour, size = str(form.get("colour") or ""), str(form.get("size") or "")
    with episode_db(request, "shop") as db:
        row = db.execute("SELECT id FROM products WHERE sku=?", (sku,)).fetchone()
        if row is None:
            raise HTTPException(404, f"No product {sku!r}.")
        colours = {r[0] for r in db.execute("SELECT colour FROM product_colours WHERE product_id=?", (row["id"],))}
        sizes = {r[0] for r in db.execute("SELECT size FROM product_sizes WHERE product_id=?", (row["id"],))}
        if colour not in colours:
            raise bad(f"Please choose a colour ({', '.join(sorted(colours))}).")
        if sizes and size not in sizes:
            raise bad(f"Please choose a size ({', '.join(sorted(sizes))}).")
        same = db.execute("SELECT id FROM cart_items WHERE product_id=? AND colour=? AND size=?",
                          (row["id"], colour, size)).fetchone()
        if same:
            db.execute("UPDATE cart_items SET qty = MIN(qty + ?, 99) WHERE id=?", (qty, same["id"]))
        else:
            db.execute("INSERT INTO cart_items (product_id, colour, size, qty) VALUES (?,?,?,?)",
                       (row["id"], colour, size, qty))
    return see_other(h.url(f"{base(request, 'shop')}/checkout/cart/", msg="You added the product to your cart."))


def _cart_rows(db) -> list:
    return db.execute("SELECT ci.id, ci.qty, ci.colour, ci.size, p.sku, p.name, p.price_cents, p.id AS product_id "
                      "FROM cart_items ci JOIN products p ON p.id = ci.product_id ORDER BY ci.id").fetchall()


def _cart_table(request: Request, rows: list, *, editable: bool) -> str:
    root = base(request, "shop")
    body = []
    for r in rows:
        remove = h.form(f"{root}/cart/remove/{r['id']}", "", f"Remove {r['name']}") if editable else ""
        item = h.link(f"{root}/product/{r['sku']}", r["name"])
        body.append(f"<tr><td>{item}</td><td>{h.esc(r['colour'])}</td>"
                    f"<td>{h.esc(r['size'])}</td><td>{r['qty']}</td><td>{money(r['price_cents'])}</td>"
                    f"<td>{money(r['qty'] * r['price_cents'])}</td><td>{remove}</td></tr>")
    total = sum(r["qty"] * r["price_cents"] for r in rows)
    return ("<table><thead><tr><th>Item</th><th>Colour</th><th>Size</th><th>Qty</th><th>Price</th><th>Subtotal</th>"
            f"<th></th></tr></thead><tbody>{''.join(body)}</tbody></table><p>Order total: {money(total)}</p>")


def cart(request: Request) -> HTMLResponse:
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        rows = _cart_rows(db)
    if not rows:
        return shop_page(request, "Shopping Cart", "<h1>Shopping Cart</h1><p>You have no items in your shopping "
                                                   "cart.</p>")
    return shop_page(request, "Shopping Cart", f"<h1>Shopping Cart</h1>{_cart_table(request, rows, editable=True)}"
                                               f"<p>{h.link(f'{root}/checkout/', 'Proceed to Checkout')}</p>")


def remove_from_cart(request: Request):
    item = int_param(request.path_params["item"], "cart item")
    with episode_db(request, "shop") as db:
        if db.execute("DELETE FROM cart_items WHERE id=?", (item,)).rowcount == 0:
            raise HTTPException(404, f"No item {item} in the cart.")
    return see_other(h.url(f"{base(request, 'shop')}/checkout/cart/", msg="You removed the item."))


async def checkout(request: Request):
    root = base(request, "shop")
    if request.method == "POST":
        form = await request.form()
        address = {key: text_param(form, key, label, max_len=200) for key, label in ADDRESS_FIELDS}
        with episode_db(request, "shop") as db:
            rows = _cart_rows(db)
            if not rows:
                raise bad("Your cart is empty: add a product before placing an order.")
            last = db.execute("SELECT MAX(created_at) FROM orders").fetchone()[0] or "2026-01-01"
            oid = db.execute("INSERT INTO orders (created_at, status, total_cents, ship_name, street, city, zip, "
                             "country) VALUES (date(?, '+1 day'),'Pending',?,?,?,?,?,?)",
                             (last, sum(r["qty"] * r["price_cents"] for r in rows),
                              *(address[k] for k, _ in ADDRESS_FIELDS))).lastrowid
            db.executemany("INSERT INTO order_items (order_id, product_id, name, colour, size, qty, price_cents) "
                           "VALUES (?,?,?,?,?,?,?)", [(oid, r["product_id"], r["name"], r["colour"], r["size"],
                                                       r["qty"], r["price_cents"]) for r in rows])
            db.execute("DELETE FROM cart_items")
        return see_other(f"{root}/checkout/success/{oid}")
    with episode_db(request, "shop") as db:
        rows = _cart_rows(db)
        c = db.execute("SELECT * FROM customer WHERE id=1").fetchone()
    if not rows:
        return shop_page(request, "Checkout", "<h1>Checkout</h1><p>You have no items in your shopping cart.</p>")
    defaults = {"ship_name": f"{c['first_name']} {c['last_name']}", "street": c["street"], "city": c["city"],
                "zip": c["zip"], "country": c["country"]}
    fields = "".join(h.textbox(key, label, defaults[key]) for key, label in ADDRESS_FIELDS)
    body = (f"<h1>Checkout</h1><h2>Order summary</h2>{_cart_table(request, rows, editable=False)}"
            f"<h2>Shipping address</h2>{h.form(f'{root}/checkout/', fields, 'Place Order', label='Shipping address')}")
    return shop_page(request, "Checkout", body)


def success(request: Request) -> HTMLResponse:
    oid = int_param(request.path_params["order"], "order")
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        if db.execute("SELECT 1 FROM orders WHERE id=?", (oid,)).fetchone() is None:
            raise HTTPException(404, f"No order #{oid}.")
    body = (f"<h1>Thank you for your purchase!</h1><p>Your order number is #{oid}.</p>"
            f"<p>{h.link(f'{root}/sales/order/view/order_id/{oid}/', f'View order #{oid}')}</p>")
    return shop_page(request, "Success", body)


def history(request: Request) -> HTMLResponse:
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        rows = db.execute("SELECT * FROM orders ORDER BY created_at DESC, id DESC").fetchall()
    def view(oid: int) -> str:
        return h.link(f"{root}/sales/order/view/order_id/{oid}/", f"View Order #{oid}")

    body = "".join(f"<tr><td>#{r['id']}</td><td>{r['created_at']}</td><td>{money(r['total_cents'])}</td>"
                   f"<td>{h.esc(r['status'])}</td><td>{view(r['id'])}</td></tr>" for r in rows)
    return shop_page(request, "My Orders", f"<h1>My Orders</h1><p>{len(rows)} orders</p><table><thead><tr><th>Order #"
                                           f"</th><th>Date</th><th>Order Total</th><th>Status</th><th>Action</th>"
                                           f"</tr></thead><tbody>{body}</tbody></table>")


def order_view(request: Request) -> HTMLResponse:
    oid = int_param(request.path_params["order"], "order")
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        o = db.execute("SELECT * FROM orders WHERE id=?", (oid,)).fetchone()
        if o is None:
            raise HTTPException(404, f"No order #{oid}.")
        items = db.execute("SELECT oi.*, p.sku FROM order_items oi JOIN products p ON p.id = oi.product_id "
                           "WHERE order_id=? ORDER BY oi.id", (oid,)).fetchall()
    def item(i) -> str:
        return h.link(f"{root}/product/{i['sku']}", i["name"])

    rows = "".join(f"<tr><td>{item(i)}</td><td>{h.esc(i['colour'])}</td>"
                   f"<td>{h.esc(i['size'])}</td><td>{i['qty']}</td><td>{money(i['price_cents'])}</td></tr>"
                   for i in items)
    body = (f"<h1>Order #{oid}</h1><p>Status: {h.esc(o['status'])}</p><p>Order date: {o['created_at']}</p>"
            f"<div class=\"order-details-items ordered\"><table><thead><tr><th>Product</th><th>Colour</th>"
            f"<th>Size</th><th>Qty</th><th>Price</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<p>Grand total: {money(o['total_cents'])}</p></div>"
            f"<h2>Shipping address</h2><address>{h.esc(o['ship_name'])}<br>{h.esc(o['street'])}<br>"
            f"{h.esc(o['city'])} {h.esc(o['zip'])}<br>{h.esc(o['country'])}</address>")
    return shop_page(request, f"Order #{oid}", body)


async def account(request: Request):
    root = base(request, "shop")
    if request.method == "POST":
        form = await request.form()
        values = {key: text_param(form, key, label, max_len=200) for key, label in ACCOUNT_FIELDS}
        with episode_db(request, "shop") as db:
            db.execute(f"UPDATE customer SET {', '.join(f'{k}=?' for k in values)} WHERE id=1", list(values.values()))
        return see_other(h.url(f"{root}/customer/account/", msg="You saved the account information."))
    with episode_db(request, "shop") as db:
        c = db.execute("SELECT * FROM customer WHERE id=1").fetchone()
    if request.url.path.rstrip("/").endswith("/edit"):
        fields = "".join(h.textbox(key, label, c[key]) for key, label in ACCOUNT_FIELDS)
        return shop_page(request, "Edit Account Information", "<h1>Edit Account Information</h1>"
                         + h.form(f"{root}/customer/account/edit/", fields, "Save", label="Account information"))
    # Magento's class names, so locators written for WebArena's shop find the same parts here.
    body = (f"<h1>My Account</h1><div class=\"box box-information\"><h2>Contact Information</h2>"
            f"<div class=\"box-content\"><p>{h.esc(c['first_name'])} {h.esc(c['last_name'])}</p>"
            f"<p>Email: {h.esc(c['email'])}</p><p>Phone: {h.esc(c['phone'])}</p></div></div>"
            f"<div class=\"box box-address-shipping\"><h2>Default Shipping Address</h2><div class=\"box-content\">"
            f"<address>{h.esc(c['street'])}<br>{h.esc(c['city'])} {h.esc(c['zip'])}<br>{h.esc(c['country'])}"
            f"</address></div></div><p>{h.link(f'{root}/customer/account/edit/', 'Edit Account Information')}</p>")
    return shop_page(request, "My Account", body)


ROUTES = [
    Route("/cart/add", add_to_cart, methods=["POST"]), Route("/checkout/cart/", cart),
    Route("/cart/remove/{item}", remove_from_cart, methods=["POST"]),
    Route("/checkout/", checkout, methods=["GET", "POST"]), Route("/checkout/success/{order}", success),
    Route("/sales/order/history/", history), Route("/sales/order/view/order_id/{order}/", order_view),
    Route("/customer/account/", account), Route("/customer/account/edit/", account, methods=["GET", "POST"]),
]
