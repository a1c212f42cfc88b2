/*
 * Long tokens wrap; ordinary words stay whole.
 *
 * A column of the admin's tables is as narrow as its longest unbreakable run of text, so one
 * 150-character username, path or key would push the later columns off a 1,280 px window;
 * letting every word break anywhere (CSS `overflow-wrap: anywhere`) instead lets the browser
 * squeeze columns until "anonymous" breaks into "anony mous". So only long tokens get break
 * points: after each separator (/ - _ : . @ , = & ?), so a path, a setting's name or a time
 * zone breaks between its parts, and a run without separators longer than LONG is put in a
 * `dt-long` span that may break anywhere (admin.css). Text is only read and split, never
 * parsed as HTML.
 */
'use strict';
(function() {
    const LONG = 30;
    const TOKEN = /\S{16,}/g;
    const PARTS = /[^\/\-_:.@,=&?]+[\/\-_:.@,=&?]*|[\/\-_:.@,=&?]+/g;
    const SKIP = 'script, style, textarea, option, select, svg, .dt-long';

    function pieces(token) {
        const out = [];
        for (const part of token.match(PARTS) || [token]) {
            const word = part.replace(/[\/\-_:.@,=&?]+$/, '');
            if (word.length > LONG) {
                const span = document.createElement('span');
                span.className = 'dt-long';
                span.textContent = word;
                out.push(span, part.slice(word.length));
            } else {
                out.push(part);
            }
            out.push(document.createElement('wbr'));
        }
        return out;
    }

    function split(node) {
        const text = node.data;
        const fragment = document.createDocumentFragment();
        let last = 0;
        for (const match of text.matchAll(TOKEN)) {
            fragment.append(text.slice(last, match.index), ...pieces(match[0]));
            last = match.index + match[0].length;
        }
        fragment.append(text.slice(last));
        node.replaceWith(fragment);
    }

    function start() {
        document.querySelectorAll('#content, .breadcrumbs').forEach(function(root) {
            const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
            const found = [];
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                TOKEN.lastIndex = 0;
                if (TOKEN.test(node.data) && !node.parentElement.closest(SKIP)) {
                    found.push(node);
                }
            }
            found.forEach(split);
        });
    }
    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', start);
    } else {
        start();
    }
})();
