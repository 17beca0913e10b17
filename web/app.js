// Boot and navigation: the sign-in view or the app view, the hash router
// (#overview, #fleet, ...), and each page's render/dispose lifecycle.

import { resume, signIn, signOut, signedIn, whenSignedOut } from './api.js';
import { clearFlash, flashError } from './ui.js';

const PAGES = ['overview', 'fleet', 'market', 'money', 'keys', 'caches', 'models'];
const $ = (id) => document.getElementById(id);

let current = null; // the page module shown, for its dispose()
let generation = 0; // bumped per navigation: a slower earlier render is dropped

function leavePage() {
  current?.dispose?.();
  current = null;
  generation += 1;
}

function showSignIn(message) {
  leavePage();
  $('app-view').hidden = true;
  $('signin-view').hidden = false;
  const err = document.querySelector('[data-testid="signin-error"]');
  err.textContent = message ?? '';
  err.hidden = !message;
  document.querySelector('#signin input[name="token"]').focus();
}

function pageName() {
  const name = location.hash.replace(/^#/, '');
  return PAGES.includes(name) ? name : 'overview';
}

async function route() {
  if (!signedIn()) return;
  leavePage();
  const mine = generation;
  const name = pageName();
  for (const a of $('nav').querySelectorAll('a')) {
    const here = a.getAttribute('href') === `#${name}`;
    a.classList.toggle('current', here);
    if (here) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  clearFlash();
  const view = document.createElement('div');
  view.className = `page page-${name}`;
  $('main').replaceChildren(view);
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · Synor Compute`;
  try {
    const mod = await import(`./pages/${name}.js`);
    if (mine !== generation) return;
    current = mod;
    await mod.render(view);
  } catch (err) {
    if (mine === generation && err.status !== 401) flashError(err);
  }
}

function showApp() {
  $('signin-view').hidden = true;
  $('app-view').hidden = false;
  route();
}

async function onSignIn(ev) {
  ev.preventDefault();
  const form = ev.currentTarget;
  const button = form.querySelector('button');
  const err = document.querySelector('[data-testid="signin-error"]');
  button.disabled = true;
  try {
    await signIn(form.elements.token.value);
    form.reset();
    err.hidden = true;
    showApp();
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
  } finally {
    button.disabled = false;
  }
}

// The page drops its session whatever the server answered; a refused
// sign-out is said on the sign-in view (the cookie may still be live).
async function onSignOut() {
  try {
    await signOut();
  } catch (e) {
    showSignIn(`Signing out failed: ${e.message}`);
    return;
  }
  showSignIn();
}

// A new tab has no CSRF token yet: the cookie's live session gives it.
async function boot() {
  $('signin').addEventListener('submit', onSignIn);
  $('signout').addEventListener('click', onSignOut);
  window.addEventListener('hashchange', route);
  whenSignedOut(() => showSignIn('Your session has ended: sign in again.'));
  let resumed = false;
  try {
    resumed = await resume();
  } catch (e) {
    showSignIn(e.message);
    return;
  }
  if (resumed) showApp();
  else showSignIn();
}

boot();
