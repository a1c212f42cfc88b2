/*
 * A slug the admin filled in from the name is selected whole when the operator clicks or tabs
 * into it, so what they type replaces it.
 *
 * Django's prepopulated_fields fills the slug in while the name is typed. An operator who then
 * clicked into the slug to type it themselves got the caret after the filled-in text, and the
 * two run together: the name "anonymous" and then the slug "anonymous" made the slug
 * "anonymousanonymous". Once the operator has typed in the slug it is theirs, and a click places
 * the caret as usual; a slug that was there when the page loaded (a change page) is never
 * selected for them.
 */
'use strict';
(function() {
    function prepopulatedInputs() {
        const constants = document.getElementById('django-admin-prepopulated-fields-constants');
        if (!constants || !constants.dataset.prepopulatedFields) {
            return [];
        }
        let fields;
        try {
            fields = JSON.parse(constants.dataset.prepopulatedFields);
        } catch (error) {
            return [];
        }
        return fields
            .map(function(field) {
                // Inline rows' templates (ids with __prefix__) are not in the form yet.
                return field.id.includes('__prefix__') ? null : document.querySelector(field.id);
            })
            .filter(Boolean);
    }

    function selectWhileFilledIn(input) {
        if (input.value !== '') {
            return;
        }
        let typed = false;
        let focusedNow = false;
        const filledIn = function() {
            return !typed && input.value !== '';
        };
        input.addEventListener('input', function() {
            typed = true;
        });
        input.addEventListener('focus', function() {
            focusedNow = true;
            if (filledIn()) {
                input.select();
            }
        });
        input.addEventListener('blur', function() {
            focusedNow = false;
        });
        // A click places the caret after focus: select again on the click that focused it.
        input.addEventListener('click', function() {
            if (focusedNow && filledIn()) {
                input.select();
            }
            focusedNow = false;
        });
    }

    function init() {
        prepopulatedInputs().forEach(selectWhileFilledIn);
    }

    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', init);
    } else {
        init();
    }
})();
