// The im.webchat page: join a room, chat live (Server-Sent Events), send text and files,
// and confirm a pairing link. Plain JS, no build step; served from the Connector binary.
// The visitor's session lives in an HttpOnly cookie the server sets on join: this script
// never sees the token, and no URL ever carries it.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  // The path the Connector is served under ("" at a host's root; "/connectors/webchat" behind
  // a proxy that serves it under that prefix), set by the server from its public URL.
  const ROOT = document.documentElement.dataset.root || '';
  // Largest upload the server takes (VisitorLimits::max_upload_bytes).
  const MAX_UPLOAD_BYTES = 25 * 1024 * 1024;
  // Raster types shown inline; everything else is a download (same list as the server).
  const INLINE_IMAGES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/avif', 'image/bmp'];
  const views = ['join', 'pair', 'chat'];
  const chat = {
    room: null,
    source: null,
    entries: new Map(), // message_id -> entry
    nodes: new Map(), // message_id or local:<client_id> -> <li>
    locals: new Map(), // client_id -> local entry not yet stored by the server
    queue: [], // sends waiting for the server
    flushing: false,
    failures: 0,
    pinned: true, // the list follows the newest message until the visitor scrolls up
    lastTop: 0, // where the list was last scrolled, to tell a scroll up from content growing
  };

  // Tokens of earlier versions of this page were kept in localStorage: drop them.
  try {
    for (const key of Object.keys(localStorage)) {
      if (key.startsWith('webchat.token.')) localStorage.removeItem(key);
    }
  } catch (_) {
    // Storage disabled: nothing to clean.
  }

  // A content type's essence (no parameters, lower case), as the server parses it.
  function essence(mime) {
    return String(mime || '').split(';')[0].trim().toLowerCase();
  }

  function show(view) {
    for (const v of views) $('view-' + v).hidden = v !== view;
  }

  function newId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2);
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, url, body) {
    const headers = {};
    let payload;
    if (body instanceof FormData) payload = body;
    else if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      payload = JSON.stringify(body);
    }
    const response = await fetch(url, { method, headers, body: payload, credentials: 'same-origin' });
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const message = data && data.error && data.error.message ? data.error.message : 'HTTP ' + response.status;
      throw new ApiError(response.status, message);
    }
    return data;
  }

  // ---------------------------------------------------------------- join

  function showJoin(room, message) {
    show('join');
    $('room-name').textContent = 'Web chat';
    $('agent-state').textContent = '';
    $('join-room').value = room || '';
    $('join-room').readOnly = !!room;
    const error = $('join-error');
    error.hidden = !message;
    error.textContent = message || '';
    (room ? $('join-code') : $('join-room')).focus();
  }

  function roomIdOf(name) {
    return name.trim().toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '');
  }

  async function join(room, code) {
    const result = await api('POST', ROOT + '/chat/api/rooms/' + encodeURIComponent(room) + '/join', { access_code: code });
    history.replaceState(null, '', ROOT + '/chat/r/' + encodeURIComponent(result.room_id));
    startChat(result.room_id);
  }

  $('join-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const room = roomIdOf($('join-room').value);
    const button = $('join-button');
    button.disabled = true;
    try {
      await join(room, $('join-code').value);
    } catch (error) {
      showJoin($('join-room').readOnly ? room : '', error.message);
    } finally {
      button.disabled = false;
    }
  });

  // ---------------------------------------------------------------- pairing

  async function startPairing(token) {
    show('pair');
    $('room-name').textContent = 'Pairing';
    $('agent-state').textContent = '';
    const status = $('pair-status');
    const error = $('pair-error');
    try {
      const scanned = await api('POST', ROOT + '/chat/api/pair/' + encodeURIComponent(token) + '/scan');
      status.textContent = 'The agent asked to open a chat room in this browser. Name the room and confirm.';
      $('pair-room').value = scanned.suggested_room_name || '';
      $('pair-confirm').hidden = false;
      $('pair-room').focus();
    } catch (e) {
      status.textContent = 'This pairing link cannot be used.';
      error.textContent = e.message;
      error.hidden = false;
    }
    $('pair-form').addEventListener('submit', async (event) => {
      event.preventDefault();
      const button = $('pair-button');
      button.disabled = true;
      error.hidden = true;
      try {
        const result = await api('POST', ROOT + '/chat/api/pair/' + encodeURIComponent(token) + '/confirm', {
          room_name: $('pair-room').value,
        });
        sessionStorage.setItem('webchat.invite.' + result.room_id, result.access_code);
        history.replaceState(null, '', ROOT + '/chat/r/' + encodeURIComponent(result.room_id));
        startChat(result.room_id);
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
        button.disabled = false;
      }
    });
  }

  // ---------------------------------------------------------------- chat

  function startChat(room) {
    if (chat.source) chat.source.close();
    chat.source = null;
    chat.room = room;
    chat.pinned = true;
    show('chat');
    $('room-name').textContent = room;
    const invite = sessionStorage.getItem('webchat.invite.' + room);
    if (invite) {
      $('invite-code').textContent = invite;
      $('invite').hidden = false;
    }
    connect();
    $('text').focus();
  }

  $('invite-close').addEventListener('click', () => {
    $('invite').hidden = true;
    sessionStorage.removeItem('webchat.invite.' + chat.room);
  });

  function eventsUrl() {
    return ROOT + '/chat/api/rooms/' + encodeURIComponent(chat.room) + '/events';
  }

  function fileUrl(file) {
    return ROOT + '/chat/api/rooms/' + encodeURIComponent(chat.room) + '/files/' + encodeURIComponent(file.file_ref);
  }

  function connect() {
    if (chat.source) chat.source.close();
    const source = new EventSource(eventsUrl());
    chat.source = source;
    source.onopen = () => {
      chat.failures = 0;
      $('banner').hidden = true;
    };
    source.onmessage = (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      apply(data);
    };
    source.onerror = async () => {
      $('banner').hidden = false;
      setAgent(false, 'offline');
      if (source.readyState !== EventSource.CLOSED) return; // the browser retries by itself
      chat.failures += 1;
      // Refused outright: find out whether the session is still good before trying again.
      try {
        const probe = await fetch(ROOT + '/chat/api/rooms/' + encodeURIComponent(chat.room) + '/session', { credentials: 'same-origin' });
        if (probe.status === 403) {
          source.close();
          showJoin(chat.room, 'Your access to this room ended; enter the access code again.');
          return;
        }
      } catch (_) {
        // Server unreachable: keep trying.
      }
      await sleep(Math.min(1000 * chat.failures, 5000));
      if (chat.source === source) connect();
    };
  }

  function setAgent(online, text) {
    const el = $('agent-state');
    el.classList.toggle('online', online);
    el.classList.toggle('offline', !online);
    el.textContent = text || (online ? 'agent online' : 'agent offline');
  }

  function apply(event) {
    switch (event.kind) {
      case 'snapshot':
        $('room-name').textContent = event.room_name;
        document.title = event.room_name + ' — Web chat';
        setAgent(event.agent_online);
        chat.entries.clear();
        for (const node of chat.nodes.values()) node.remove();
        chat.nodes.clear();
        for (const entry of event.messages) upsert(entry);
        for (const local of chat.locals.values()) renderLocal(local);
        for (const draft of event.drafts || []) setDraft(draft);
        setActivity(event.activity || null);
        renderEmpty();
        // A room opens at its newest message (and stays there while images load).
        chat.pinned = true;
        scrollDown(true);
        flush();
        break;
      case 'message':
        upsert(event.message);
        break;
      case 'draft':
        setDraft(event.draft);
        break;
      case 'activity':
        setActivity(event.activity || null);
        break;
      case 'agent':
        setAgent(event.online);
        break;
      default:
        break;
    }
  }

  function nearBottom() {
    const list = $('messages');
    return list.scrollHeight - list.scrollTop - list.clientHeight < 120;
  }

  function scrollDown(force) {
    const list = $('messages');
    if (force || chat.pinned || nearBottom()) {
      list.scrollTop = list.scrollHeight;
      chat.lastTop = list.scrollTop;
      chat.pinned = true;
    }
  }

  // Only the visitor scrolling up unpins the list; scrolling back to the end pins it again.
  // Content growing below (an image learning its size before its load event) moves the end
  // away without moving scrollTop up, so it never unpins.
  $('messages').addEventListener('scroll', () => {
    const list = $('messages');
    if (list.scrollTop + 1 < chat.lastTop) chat.pinned = nearBottom();
    else if (nearBottom()) chat.pinned = true;
    chat.lastTop = list.scrollTop;
  }, { passive: true });

  // While pinned, any change of the list's size or of a message's size keeps the newest in view.
  const follow = typeof ResizeObserver === 'function'
    ? new ResizeObserver(() => { if (chat.pinned) scrollDown(false); })
    : null;
  if (follow) {
    follow.observe($('messages'));
    new MutationObserver((changes) => {
      for (const change of changes) {
        for (const node of change.addedNodes) if (node.nodeType === 1) follow.observe(node);
        for (const node of change.removedNodes) if (node.nodeType === 1) follow.unobserve(node);
      }
    }).observe($('messages'), { childList: true });
  }

  function renderEmpty() {
    const list = $('messages');
    let empty = list.querySelector('.empty');
    const hasMessages = chat.nodes.size > 0;
    if (!hasMessages && !empty) {
      empty = document.createElement('li');
      empty.className = 'empty';
      empty.textContent = 'No messages yet. Say hello!';
      list.appendChild(empty);
    } else if (hasMessages && empty) {
      empty.remove();
    }
  }

  function humanSize(bytes) {
    if (bytes === undefined || bytes === null) return '';
    if (bytes < 1024) return bytes + ' B';
    if (bytes < 1024 * 1024) return (bytes / 1024).toFixed(1) + ' KB';
    return (bytes / 1024 / 1024).toFixed(1) + ' MB';
  }

  function fileNode(file, localUrl) {
    const url = localUrl || fileUrl(file);
    if (INLINE_IMAGES.includes(essence(file.mime_type))) {
      const link = document.createElement('a');
      link.href = url;
      link.target = '_blank';
      link.rel = 'noopener';
      const img = document.createElement('img');
      img.src = url;
      img.alt = file.filename;
      img.addEventListener('load', () => scrollDown(false));
      img.addEventListener('error', () => scrollDown(false));
      link.appendChild(img);
      return link;
    }
    const link = document.createElement('a');
    link.className = 'file-link';
    link.href = url;
    link.download = file.filename;
    link.textContent = '📄 ' + file.filename + (file.byte_size ? ' · ' + humanSize(file.byte_size) : '');
    return link;
  }

  function time(ms) {
    const d = ms ? new Date(ms) : new Date();
    return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  }

  function buildNode(entry, opts) {
    const li = document.createElement('li');
    li.className = 'msg ' + entry.author;
    li.dataset.id = entry.message_id || '';
    const bubble = document.createElement('div');
    bubble.className = 'bubble';
    if (entry.text) {
      const text = document.createElement('div');
      text.className = 'text';
      text.textContent = entry.text;
      bubble.appendChild(text);
    }
    if (entry.files && entry.files.length) {
      const files = document.createElement('div');
      files.className = 'files';
      for (const file of entry.files) files.appendChild(fileNode(file, opts && opts.localUrl));
      bubble.appendChild(files);
    }
    if (!entry.text) bubble.classList.add('media');
    li.appendChild(bubble);
    const meta = document.createElement('div');
    meta.className = 'meta';
    let label = time(entry.created_at);
    if (entry.author === 'visitor') {
      if (entry.status === 'delivered') {
        label += ' · delivered ✓';
      } else if (entry.status === 'rejected' || entry.status === 'expired' || entry.status === 'failed') {
        label += ' · not delivered' + (entry.error ? ': ' + entry.error : '');
        meta.classList.add('bad');
        li.classList.add('rejected');
      } else if (entry.status === 'waiting') {
        label += ' · waiting for the connection…';
      } else {
        label += ' · sending…';
      }
    }
    meta.textContent = label;
    li.dataset.status = entry.status || '';
    li.appendChild(meta);
    return li;
  }

  function place(key, node) {
    const list = $('messages');
    const old = chat.nodes.get(key);
    if (old) {
      old.replaceWith(node);
    } else {
      // Keep streaming drafts last.
      const draft = key.startsWith('draft:') ? null : list.querySelector('.msg.draft');
      if (draft) list.insertBefore(node, draft);
      else list.appendChild(node);
    }
    chat.nodes.set(key, node);
  }

  function upsert(entry) {
    const known = chat.entries.get(entry.message_id);
    if (known && known.status !== 'sending' && entry.status === 'sending') {
      // A late answer to our own POST must not undo a delivery state the stream already showed.
      entry = known;
    }
    const stick = nearBottom();
    chat.entries.set(entry.message_id, entry);
    if (entry.client_id && chat.locals.has(entry.client_id)) {
      // The server stored our send: its message takes the place of the local one.
      chat.locals.delete(entry.client_id);
      const key = 'local:' + entry.client_id;
      const local = chat.nodes.get(key);
      chat.nodes.delete(key);
      if (local) {
        if (chat.nodes.has(entry.message_id)) local.remove();
        else chat.nodes.set(entry.message_id, local);
      }
    }
    const draft = chat.nodes.get('draft:' + entry.message_id);
    if (draft) {
      // The final message takes the place of its streamed draft.
      chat.nodes.delete('draft:' + entry.message_id);
      if (chat.nodes.has(entry.message_id)) draft.remove();
      else chat.nodes.set(entry.message_id, draft);
    }
    place(entry.message_id, buildNode(entry));
    renderEmpty();
    scrollDown(stick);
  }

  function setDraft(draft) {
    if (chat.entries.has(draft.message_id)) return; // the final already arrived
    const stick = nearBottom();
    const node = buildNode({ author: 'assistant', text: draft.text, message_id: draft.message_id });
    node.classList.add('draft');
    node.querySelector('.meta').textContent = 'typing…';
    place('draft:' + draft.message_id, node);
    renderEmpty();
    scrollDown(stick);
  }

  function setActivity(activity) {
    const box = $('activity');
    if (!activity) {
      box.hidden = true;
      return;
    }
    $('activity-text').textContent = activity.status === 'tool' && activity.tool_name
      ? 'Agent is using ' + activity.tool_name + '…'
      : 'Agent is thinking…';
    box.hidden = false;
    scrollDown(false);
  }

  // ---------------------------------------------------------------- sending

  function renderLocal(local) {
    const entry = {
      author: 'visitor',
      text: local.text,
      files: local.file ? [{ filename: local.file.name, mime_type: local.file.type, byte_size: local.file.size }] : [],
      status: local.status,
      error: local.error,
      created_at: local.created_at,
      message_id: '',
    };
    place('local:' + local.client_id, buildNode(entry, { localUrl: local.previewUrl }));
    renderEmpty();
  }

  function enqueue(local) {
    chat.locals.set(local.client_id, local);
    renderLocal(local);
    scrollDown(true);
    chat.queue.push(local);
    flush();
  }

  async function flush() {
    if (chat.flushing) return;
    chat.flushing = true;
    try {
      while (chat.queue.length) {
        const local = chat.queue[0];
        try {
          let entry;
          const base = ROOT + '/chat/api/rooms/' + encodeURIComponent(chat.room);
          if (local.file) {
            const form = new FormData();
            form.append('client_id', local.client_id);
            if (local.text) form.append('text', local.text);
            form.append('file', local.file, local.file.name);
            entry = await api('POST', base + '/uploads', form);
          } else {
            entry = await api('POST', base + '/messages', { text: local.text, client_id: local.client_id });
          }
          chat.queue.shift();
          upsert(entry);
        } catch (error) {
          // Refusals (4xx) and a full store (507) are final; other errors are retried.
          if (error instanceof ApiError && (error.status < 500 || error.status === 507)) {
            chat.queue.shift();
            local.status = 'failed';
            local.error = error.message;
            if (chat.locals.has(local.client_id)) renderLocal(local);
          } else {
            // Network trouble or a server restart: retry with the same client_id.
            local.status = 'waiting';
            if (chat.locals.has(local.client_id)) renderLocal(local);
            await sleep(2000);
          }
        }
      }
    } finally {
      chat.flushing = false;
    }
  }

  function autoGrow() {
    const text = $('text');
    text.style.height = 'auto';
    text.style.height = Math.min(text.scrollHeight, 140) + 'px';
  }

  $('text').addEventListener('input', autoGrow);
  $('text').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $('composer').requestSubmit();
    }
  });

  $('composer').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = $('text').value.trim();
    if (!text) return;
    $('text').value = '';
    autoGrow();
    enqueue({ client_id: newId(), text, status: 'sending', created_at: Date.now() });
  });

  $('file-input').addEventListener('change', () => {
    const input = $('file-input');
    const file = input.files && input.files[0];
    input.value = '';
    if (!file) return;
    const text = $('text').value.trim();
    $('text').value = '';
    autoGrow();
    if (file.size > MAX_UPLOAD_BYTES) {
      const local = {
        client_id: newId(), text, file, status: 'failed', created_at: Date.now(),
        error: 'the file is too large: files up to ' + (MAX_UPLOAD_BYTES / 1024 / 1024) + ' MiB can be sent',
      };
      chat.locals.set(local.client_id, local);
      renderLocal(local);
      scrollDown(true);
      return;
    }
    const previewUrl = INLINE_IMAGES.includes(essence(file.type)) ? URL.createObjectURL(file) : undefined;
    enqueue({ client_id: newId(), text, file, previewUrl, status: 'sending', created_at: Date.now() });
  });

  // ---------------------------------------------------------------- routing

  function route() {
    // The path below the Connector's own root (the routes below are the server's).
    const path = location.pathname.startsWith(ROOT) ? location.pathname.slice(ROOT.length) : location.pathname;
    const pair = path.match(/^\/chat\/pair\/([^/]+)\/?$/);
    if (pair) {
      startPairing(decodeURIComponent(pair[1]));
      return;
    }
    const room = path.match(/^\/chat\/r\/([^/]+)\/?$/);
    if (room) {
      const id = decodeURIComponent(room[1]);
      const code = new URLSearchParams(location.hash.slice(1)).get('code');
      if (code) {
        history.replaceState(null, '', ROOT + '/chat/r/' + encodeURIComponent(id));
        join(id, code).catch((error) => showJoin(id, error.message));
        return;
      }
      // The session cookie (if any) decides: chat, or the join form.
      fetch(ROOT + '/chat/api/rooms/' + encodeURIComponent(id) + '/session', { credentials: 'same-origin' })
        .then((response) => (response.ok ? startChat(id) : showJoin(id)))
        .catch(() => showJoin(id, 'The chat cannot be reached right now; try again.'));
      return;
    }
    showJoin('');
  }

  // A pasted link that differs only in its fragment (#code=...) loads no new page.
  window.addEventListener('hashchange', () => {
    if (new URLSearchParams(location.hash.slice(1)).get('code')) route();
  });

  route();
})();
