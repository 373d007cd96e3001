const express = require("express");
const { parse } = require("node-html-parser");

const app = express();

app.get("/preview", async (req, res) => {
  const url = req.query.url;
  if (!url) {
    res.status(400).json({ error: "missing url" });
    return;
  }
  const page = await fetch(url);
  const root = parse(await page.text());
  const meta = (name) => root.querySelector(`meta[property="og:${name}"]`)?.getAttribute("content") ?? null;
  res.json({ title: root.querySelector("title")?.text ?? null, description: meta("description"), image: meta("image") });
});

app.listen(process.env.PORT || 3000);
