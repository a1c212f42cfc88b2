/*
 * Limit rows in the admin show only the fields their algorithm uses, and say what the rate
 * means under it.
 *
 * Each <option> of a limit row's algorithm select lists the optional fields its algorithm
 * uses (data-uses) and its help text (data-help), rendered by the server in the page's
 * language. The server refuses the same mistakes without this script; it only spares the
 * operator fields that do not apply. Choosing an algorithm that has no use for a filled field
 * empties and hides it (choosing one that uses it again brings the value back); a page as
 * loaded never hides a value, so a stored mistake stays in sight next to its error. Rows added
 * with "Add another" are handled too: events are caught on the document.
 */
'use strict';
(function() {
    const OPTIONAL = ['burst', 'delay', 'max_wait', 'timezone'];
    const SELECT = 'select.django-throttle-algorithm';

    function rowOf(select) {
        return select.closest('tr') || select.closest('.inline-related') || select.form;
    }

    function show(box, visible) {
        // A table cell stays, so the columns keep their place; what is inside it hides.
        const targets = box.tagName === 'TD' ? Array.from(box.children) : [box];
        targets.forEach(function(element) {
            if (!element.classList.contains('errorlist')) {
                element.hidden = !visible;
            }
        });
    }

    function describe(select, option) {
        const box = select.parentElement;
        let help = box.querySelector('.django-throttle-help');
        if (!help) {
            help = document.createElement('div');
            help.className = 'help django-throttle-help';
            box.appendChild(help);
        }
        help.textContent = option ? option.dataset.help || '' : '';
    }

    function apply(select, chosenNow) {
        const row = rowOf(select);
        if (!row) {
            return;
        }
        const option = select.options[select.selectedIndex];
        const known = option && option.dataset.uses !== undefined;
        const uses = known ? option.dataset.uses.split(' ') : OPTIONAL;
        OPTIONAL.forEach(function(name) {
            const box = row.querySelector('.field-' + name);
            const input = box && box.querySelector('input, select, textarea');
            if (!input) {
                return;
            }
            let used = uses.includes(name);
            if (used && input.value === '' && input.dataset.throttleKept !== undefined) {
                input.value = input.dataset.throttleKept;
            }
            if (used) {
                delete input.dataset.throttleKept;
            } else if (input.value !== '') {
                if (chosenNow) {
                    input.dataset.throttleKept = input.value;
                    input.value = '';
                } else {
                    used = true;
                }
            }
            show(box, used || box.querySelector('.errorlist') !== null);
        });
        describe(select, option);
    }

    document.addEventListener('change', function(event) {
        if (event.target.matches && event.target.matches(SELECT)) {
            apply(event.target, true);
        }
    });
    document.addEventListener('formset:added', function(event) {
        event.target.querySelectorAll(SELECT).forEach(function(select) {
            apply(select, false);
        });
    });

    function start() {
        document.querySelectorAll(SELECT).forEach(function(select) {
            apply(select, false);
        });
    }
    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', start);
    } else {
        start();
    }
})();
