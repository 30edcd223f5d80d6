"""The web console: its security over plain HTTP, and an operator's work in a real headless browser."""

from __future__ import annotations

from helpers import support

import datetime
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.parse
from typing import Any

from helpers import browser_support, pg_support, scale
from helpers.cli_case import CliCase

import longrun
from longrun.stores.jsonfile import INDEX_FILE
from longrun import Approval, JsonFileStore, Limits, PostgresStore, Runner, SqliteStore, Status, Step
from longrun.authority import FileControlSource
from longrun.cli._console import CSP, ConsoleServer, start_console
from longrun.cli._payload import payload_lines
from longrun.testing import OutboxAdapter, read_outbox

WAIT_S = 60.0
PAYLOAD = {"channel": "everyone", "subject": "Week 48", "body": "Dear all,\nthe meeting moved to 3pm.", "recipients": 120}
EVIL = {"note": "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">", "tag": "</pre><b>bold</b>"}


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: str):
        self.status, self.headers, self.body = status, headers, body


class ConsoleCase(CliCase):
    """The console writes into a strict control root (without one it is read-only), which the
    runners here read their approvals and cancellations from."""

    store_kind = "json"
    """Which store the console reads: ``json`` (``JsonFileStore``) or ``sqlite`` (``SqliteStore``)."""

    def store(self) -> Any:
        """A new store object on the test's store, closed when the test ends (each holds its
        database connections, or the JSON-file store its summary index's, until closed)."""
        store: Any
        if self.store_kind == "sqlite":
            store = SqliteStore(self.path("store.sqlite"), create=True)
        elif self.store_kind == "postgres":
            if getattr(self, "pg_schema", None) is None:
                pg_support.check()
                self.pg_schema = pg_support.Schema(prefix="lr_console")
                self.addCleanup(self.pg_schema.drop)
            store = PostgresStore(self.pg_schema.factory())  # one per caller, as separate processes would have
        else:
            store = JsonFileStore(self.store_dir, create=True)
        self.addCleanup(store.close)
        return store

    def setUp(self) -> None:
        super().setUp()
        self.control = self.path("control")
        os.mkdir(self.control, 0o755)
        os.chmod(self.control, 0o755)  # whatever the umask: strict mode refuses a group-writable root
        self.source = FileControlSource(self.control, approver_uid=os.geteuid())

    def gated(self, task_id: str = "gated", payload: dict[str, Any] = PAYLOAD) -> Runner:
        steps = [Step("draft", "send", {"text": "hello"}), Step("publish", "send", payload, approval=True)]
        runner = self.runner(task_id, steps, store=self.store(), approvals=self.source, cancellations=self.source)
        self.assertIs(runner.run().status, Status.AWAITING_APPROVAL)
        return runner

    def serve(self, **options: Any) -> ConsoleServer:
        options.setdefault("approver", "alice")
        options.setdefault("control_root", self.control)
        store = self.store()
        server = start_console(store, getattr(store, "spec", self.store_dir) if self.store_kind != "json" else self.store_dir, **options)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(thread.join, WAIT_S)
        self.addCleanup(server.shutdown)
        return server

    def request(
        self, server: ConsoleServer, method: str, path: str, *, cookie: str | None = None, form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:  # fmt: skip
        port = server.server_address[1]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
        try:
            sent = dict(headers or {})
            if cookie is not None:
                sent["Cookie"] = f"{server.cookie_name}={cookie}"
            body = None
            if form is not None:
                body = urllib.parse.urlencode(form)
                sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode("utf-8"))
        finally:
            connection.close()

    def approvals(self, task_id: str = "gated") -> list[Approval]:
        """The approvals in the control root."""
        return [Approval.from_json(record.body) for record in self.source.read_approvals(task_id)]

    def store_approvals(self, task_id: str = "gated") -> list[Approval]:
        return [Approval.from_json(record.body) for record in JsonFileStore(self.store_dir).read_approvals(task_id)]


class SecurityTests(ConsoleCase):
    def test_no_token_or_a_wrong_one_is_refused_and_the_token_becomes_a_cookie(self) -> None:
        self.gated()
        server = self.serve()
        token = server.console.token
        for path in ("/", "/task/gated", "/static/console.css", "/?token=wrong", "/task/gated?token=" + token[:-1]):
            with self.subTest(path=path):
                response = self.request(server, "GET", path)
                self.assertEqual(response.status, 403)
                self.assertNotIn("publish", response.body)
                self.assertEqual(response.headers["content-security-policy"], CSP)
        response = self.request(server, "GET", "/task/gated?token=" + token)
        self.assertEqual(response.status, 303)
        self.assertEqual(response.headers["location"], "/task/gated")
        self.assertIn("HttpOnly", response.headers["set-cookie"])
        self.assertIn("SameSite=Strict", response.headers["set-cookie"])
        page = self.request(server, "GET", "/task/gated", cookie=token)
        self.assertEqual(page.status, 200)
        self.assertIn("default-src 'none'", page.headers["content-security-policy"])
        self.assertEqual(page.headers["x-content-type-options"], "nosniff")
        self.assertIn("Approve exactly this payload", page.body)
        self.assertEqual(self.request(server, "GET", "/task/gated", cookie="x" + token[1:]).status, 403)

    def test_a_post_without_the_token_or_with_a_wrong_csrf_token_changes_nothing(self) -> None:
        self.gated()
        server = self.serve()
        token = server.console.token
        state = JsonFileStore(self.store_dir).load("gated").state
        assert state is not None
        digest = state.approval_requests["publish"].payload_digest
        form = {"csrf": server.console.csrf, "step": "publish", "payload_digest": digest}
        before = support_fingerprint(self.store_dir), support_fingerprint(self.control)
        cases = [
            ("no token", None, form, {}),
            ("no csrf", token, {k: v for k, v in form.items() if k != "csrf"}, {}),
            ("wrong csrf", token, {**form, "csrf": "0" * 64}, {}),
            ("foreign origin", token, form, {"Origin": "http://evil.example"}),
            ("foreign host", token, form, {"Host": "evil.example:80"}),
        ]
        for name, cookie, body, headers in cases:
            with self.subTest(name):
                response = self.request(server, "POST", "/task/gated/approve", cookie=cookie, form=body, headers=headers)
                self.assertEqual(response.status, 403, response.body)
                self.assertEqual(self.approvals(), [])
                response = self.request(server, "POST", "/task/gated/cancel", cookie=cookie, form={**body, "reason": "x"}, headers=headers)
                self.assertEqual(response.status, 403)
                resolve = {**body, "key": "gated/publish", "outcome": "applied", "evidence": "seen"}
                self.assertEqual(self.request(server, "POST", "/task/gated/resolve", cookie=cookie, form=resolve, headers=headers).status, 403)
                reopen = {**body, "reason": "go on", "add_attempts": "0"}
                self.assertEqual(self.request(server, "POST", "/task/gated/reopen", cookie=cookie, form=reopen, headers=headers).status, 403)
        self.assertEqual((support_fingerprint(self.store_dir), support_fingerprint(self.control)), before)
        stale = self.request(server, "POST", "/task/gated/approve", cookie=token, form={**form, "payload_digest": "sha256:" + "0" * 64})
        self.assertEqual(stale.status, 409)
        self.assertIn("nothing was written", stale.body)
        self.assertEqual(self.approvals(), [])
        done = self.request(server, "POST", "/task/gated/approve", cookie=token, form=form)
        self.assertEqual(done.status, 303)
        self.assertEqual([a.payload_digest for a in self.approvals()], [digest])
        self.assertEqual(self.approvals()[0].approver, "alice")
        self.assertEqual(self.store_approvals(), [])

    def test_store_values_are_escaped(self) -> None:
        self.gated("evil", EVIL)
        server = self.serve()
        page = self.request(server, "GET", "/task/evil", cookie=server.console.token)
        self.assertEqual(page.status, 200)
        self.assertEqual(page.body.count("<script"), 1)  # the console's own, from /static/console.js
        self.assertIn('<script src="/static/console.js" defer></script>', page.body)
        self.assertNotIn("<script>", page.body)
        self.assertNotIn("<img", page.body)
        self.assertNotIn("<b>", page.body)
        self.assertIn("&lt;script&gt;", page.body)

    def test_read_only_shows_no_form_and_refuses_posts(self) -> None:
        self.gated()
        for label, options, shown in [
            ("--read-only", {"read_only": True}, "read-only"),
            ("no control root", {"control_root": None}, "read-only: no --control-root"),
        ]:
            with self.subTest(label):
                server = self.serve(**options)
                self.assertTrue(server.console.read_only)
                token = server.console.token
                page = self.request(server, "GET", "/task/gated", cookie=token)
                self.assertNotIn("<form class=\"inline\"", page.body)
                self.assertIn(shown, page.body)
                state = JsonFileStore(self.store_dir).load("gated").state
                assert state is not None
                form = {"csrf": server.console.csrf, "step": "publish", "payload_digest": state.approval_requests["publish"].payload_digest}
                before = support_fingerprint(self.store_dir), support_fingerprint(self.control)
                self.assertEqual(self.request(server, "POST", "/task/gated/approve", cookie=token, form=form).status, 403)
                cancel = {"csrf": server.console.csrf, "reason": "x"}
                self.assertEqual(self.request(server, "POST", "/task/gated/cancel", cookie=token, form=cancel).status, 403)
                reopen = {"csrf": server.console.csrf, "reason": "x", "add_attempts": "0"}
                self.assertEqual(self.request(server, "POST", "/task/gated/reopen", cookie=token, form=reopen).status, 403)
                resolve = {**form, "key": "gated/publish", "outcome": "applied", "evidence": "seen"}
                self.assertEqual(self.request(server, "POST", "/task/gated/resolve", cookie=token, form=resolve).status, 403)
                self.assertEqual((support_fingerprint(self.store_dir), support_fingerprint(self.control)), before)
                self.assertEqual((self.approvals(), self.store_approvals()), ([], []))

    def test_cancel_writes_the_cancellation_the_cli_would(self) -> None:
        runner = self.gated()
        server = self.serve()
        response = self.request(server, "POST", "/task/gated/cancel", cookie=server.console.token,
                                form={"csrf": server.console.csrf, "reason": "wrong audience"})  # fmt: skip
        self.assertEqual(response.status, 303)
        self.assertIsNone(JsonFileStore(self.store_dir).read_cancellation("gated"))
        record = self.source.read_cancellation("gated")
        assert record is not None
        self.assertEqual((record.body["reason"], record.body["requested_by"]), ("wrong audience", "alice"))  # type: ignore[index]
        self.assertIs(runner.run().status, Status.CANCELLED)

    def test_approvals_go_signed_into_a_strict_control_root_as_the_cli_writes_them(self) -> None:
        from longrun.authority import SignedApprovals, SignedCancellations, generate_key_file, load_key

        key_file = self.path("approver.key")
        generate_key_file(key_file)
        control, source = self.control, self.source
        key = load_key(key_file)
        steps = [Step("draft", "send", {"text": "hello"}), Step("publish", "send", PAYLOAD, approval=True)]
        sources = {"approvals": SignedApprovals(source, key), "cancellations": SignedCancellations(source, key)}
        self.assertIs(self.runner("gated", steps, **sources).run().status, Status.AWAITING_APPROVAL)
        server = self.serve(sign_key=key_file, control_root=control)
        page = self.request(server, "GET", "/task/gated", cookie=server.console.token)
        self.assertIn("(signed)", page.body)
        state = JsonFileStore(self.store_dir).load("gated").state
        assert state is not None
        form = {"csrf": server.console.csrf, "step": "publish", "payload_digest": state.approval_requests["publish"].payload_digest}
        self.assertEqual(self.request(server, "POST", "/task/gated/approve", cookie=server.console.token, form=form).status, 303)
        self.assertEqual(self.store_approvals(), [], "nothing was written into the store")
        self.assertEqual(len(os.listdir(os.path.join(control, "gated", "control", "approvals"))), 1)
        self.assertTrue(self.approvals()[0].signature)
        self.assertIs(self.runner("gated", steps, **sources).run().status, Status.DONE)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["gated/publish"], 1)

    def console_process(self, *options: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "longrun", "console", self.store_dir, *options],
            env=support.child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=support.ROOT,
        )  # fmt: skip
        self.addCleanup(lambda: process.poll() is None and process.kill())
        return process

    def test_with_json_the_command_prints_its_url_and_settings_as_one_line(self) -> None:
        self.gated()
        process = self.console_process("--json", "--approver", "bob", "--control-root", self.control)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            self.fail(f"nothing printed; stderr: {process.communicate(timeout=WAIT_S)[1]}")
        settings = json.loads(line)
        self.assertEqual(urllib.parse.urlsplit(settings["url"]).hostname, "127.0.0.1")
        self.assertEqual(
            {key: settings[key] for key in ("store", "read_only", "approver", "control_root", "signed")},
            {"store": self.store_dir, "read_only": False, "approver": "bob", "control_root": self.control, "signed": False},
        )
        process.send_signal(signal.SIGINT)
        output, errors = process.communicate(timeout=WAIT_S)
        self.assertEqual((process.returncode, output), (0, ""), errors)

    def test_without_a_control_root_the_command_serves_read_only(self) -> None:
        self.gated()
        process = self.console_process("--json")
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            self.fail(f"nothing printed; stderr: {process.communicate(timeout=WAIT_S)[1]}")
        settings = json.loads(line)
        self.assertEqual((settings["read_only"], settings["approver"], settings["control_root"]), (True, None, None))
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=WAIT_S)
        self.assertEqual(process.returncode, 0, errors)

    def test_the_command_prints_a_url_with_a_token_and_binds_to_localhost(self) -> None:
        self.gated()
        process = self.console_process("--read-only")
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        if not lines[1]:
            process.kill()
            self.fail(f"no URL printed: {lines!r}; stderr: {process.communicate(timeout=WAIT_S)[1]}")
        url = lines[1].split()[-1]
        parts = urllib.parse.urlsplit(url)
        self.assertEqual(parts.hostname, "127.0.0.1")
        self.assertRegex(parts.query, r"^token=[A-Za-z0-9_-]{40,}$")
        connection = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=WAIT_S)
        connection.request("GET", "/")
        self.assertEqual(connection.getresponse().status, 403)
        connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=WAIT_S)
        connection.request("GET", f"/?{parts.query}")
        self.assertEqual(connection.getresponse().status, 303)
        connection.close()
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=WAIT_S)
        self.assertEqual(process.returncode, 0, errors)


def support_fingerprint(root: str) -> dict[str, bytes]:
    """Every file under ``root`` (but lock files, and the JSON-file store's summary index: a cache of
    the task files that the console's listings refresh) with its bytes."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if name != "lock" and not name.startswith(INDEX_FILE):
                with open(os.path.join(directory, name), "rb") as handle:
                    out[os.path.relpath(os.path.join(directory, name), root)] = handle.read()
    return out


class RunOnceTests(ConsoleCase):
    """Where no live worker runs a durable task's function, its page offers to run it once here."""

    def durable_task(self) -> Any:
        module_dir = self.path("modules")
        os.mkdir(module_dir)
        name = "console_run_once_" + os.path.basename(self.tmp).replace("-", "_")
        with open(os.path.join(module_dir, name + ".py"), "w", encoding="utf-8") as handle:
            handle.write(
                "import longrun\n"
                "from longrun.testing import OutboxAdapter\n"
                f"@longrun.durable(store=longrun.JsonFileStore({self.store_dir!r}, create=True), "
                f"adapters={{'send': OutboxAdapter({self.outbox!r})}}, allowed_actions=('send',))\n"
                "def job(run, to):\n"
                "    run.effect('mail', 'send', {'to': to})\n"
                "    return to\n"
            )
        sys.path.insert(0, module_dir)
        self.addCleanup(sys.path.remove, module_dir)
        self.addCleanup(sys.modules.pop, name, None)
        module = __import__(name)
        module.job.start("queued", "ann")
        return module.job

    def test_run_once_runs_a_task_no_worker_serves_and_only_with_the_csrf_token(self) -> None:
        self.durable_task()
        server = self.serve()
        token = server.console.token
        page = self.request(server, "GET", "/task/queued", cookie=token)
        self.assertIn("No live worker runs", page.body)
        self.assertIn("Run once", page.body)
        refused = self.request(server, "POST", "/task/queued/run", cookie=token, form={"csrf": "0" * 64})
        self.assertEqual(refused.status, 403)
        self.assertEqual(JsonFileStore(self.store_dir).load("queued").state.status, Status.QUEUED)
        ran = self.request(server, "POST", "/task/queued/run", cookie=token, form={"csrf": server.console.csrf})
        self.assertEqual(ran.status, 303, ran.body)
        self.assertEqual(JsonFileStore(self.store_dir).load("queued").state.status, Status.DONE)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["queued/mail"], 1)
        page = self.request(server, "GET", ran.headers["location"], cookie=token)
        self.assertIn("Ran the task once here", page.body)
        self.assertNotIn("Run once</button>", page.body, "an ended task offers nothing to run")

    def test_a_live_worker_of_the_function_hides_run_once_and_a_read_only_console_never_shows_it(self) -> None:
        from longrun.stores.queue import open_queue

        job = self.durable_task()
        queue = open_queue(JsonFileStore(self.store_dir))
        self.addCleanup(queue.close)
        queue.heartbeat("w1", host="here", pid=os.getpid(), state="running", concurrency=1, running=0, functions=[job.name], heartbeat_s=60.0)
        server = self.serve()
        page = self.request(server, "GET", "/task/queued", cookie=server.console.token)
        self.assertEqual(page.status, 200)
        self.assertNotIn("Run once", page.body)
        queue.heartbeat("w1", host="here", pid=os.getpid(), state="stopped", concurrency=1, running=0, functions=[job.name], heartbeat_s=60.0)
        self.assertIn("Run once", self.request(server, "GET", "/task/queued", cookie=server.console.token).body)
        read_only = self.serve(read_only=True)
        page = self.request(read_only, "GET", "/task/queued", cookie=read_only.console.token)
        self.assertNotIn("Run once", page.body)
        refused = self.request(read_only, "POST", "/task/queued/run", cookie=read_only.console.token, form={"csrf": read_only.console.csrf})
        self.assertEqual(refused.status, 403)


class BrowserCase(ConsoleCase):
    """One headless Chromium for the class; helpers to open a console page and find what it shows."""

    driver: Any = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        browser_support.check()
        cls.driver = browser_support.start_browser()

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.driver is not None:
            cls.driver.quit()
        super().tearDownClass()

    def open(self, server: ConsoleServer, path: str = "/") -> None:
        if self.driver.current_url.startswith("http"):
            self.driver.delete_all_cookies()  # each test's console has its own token
        url = server.url if path == "/" else server.url.replace("/?", path + "?")
        self.driver.get(url)

    def by(self, selector: str) -> Any:
        """The element, once the page that has it has loaded (a click's navigation may still be under way)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT_S).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector)))

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def base(self, server: ConsoleServer) -> str:
        return f"http://127.0.0.1:{server.server_address[1]}"

    def click_and_wait(self, element: Any) -> None:
        """Click (or submit), and wait until the next page has replaced this one."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        page = self.by("html")
        element.click()

        def replaced(driver: Any) -> bool:
            try:
                page.is_enabled()
            except WebDriverException:  # stale, or (mid-navigation) "does not belong to the document"
                return True
            return False

        WebDriverWait(self.driver, WAIT_S).until(replaced)

    def task_ids(self) -> list[str]:
        """The task ids the list shows, in order."""
        return [cell.text for cell in self.all("table.tasks td.task")]

    def screenshot(self, name: str) -> str:
        """Keep a screenshot of the page under ``browser_support.ARTIFACTS`` (a PNG, not blank)."""
        os.makedirs(browser_support.ARTIFACTS, exist_ok=True)
        path = os.path.join(browser_support.ARTIFACTS, f"console-{name}-{self.store_kind}.png")
        self.driver.set_window_size(1280, 1400)
        self.assertTrue(self.driver.save_screenshot(path))
        with open(path, "rb") as handle:
            data = handle.read()
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertGreater(len(data), 20_000)  # a rendered page, not a blank one
        return path


class BrowserTests(BrowserCase):
    def test_an_operator_sees_the_pending_payload_approves_it_and_the_run_continues(self) -> None:
        runner = self.gated()
        server = self.serve()
        self.open(server)
        self.assertNotIn("token=", self.driver.current_url)  # traded for a cookie
        link = self.by('a[href="/task/gated"]')
        self.assertIn("awaiting-approval", self.by("tbody tr").text)
        link.click()
        shown = self.by("pre.payload").text
        self.assertEqual(shown, "\n".join(payload_lines(PAYLOAD)))
        state = JsonFileStore(self.store_dir).load("gated").state
        assert state is not None
        request = state.approval_requests["publish"]
        self.assertEqual(self.by(".payload-digest").text, request.payload_digest)
        self.by('button[value="approve"]').click()
        self.assertIn("Approved", self.by(".notice").text)
        approvals = self.approvals()
        self.assertEqual(len(approvals), 1)
        approval = approvals[0]
        self.assertEqual(
            (approval.task_id, approval.step_id, approval.action, approval.payload_digest, approval.plan_digest),
            ("gated", "publish", "send", state.effects["publish"].payload_digest, runner.plan_digest),
        )
        self.assertEqual(approval.payload_digest, request.payload_digest)
        outcome = runner.run()
        self.assertIs(outcome.status, Status.DONE)
        sent = [line for line in read_outbox(self.outbox) if line["key"] == "gated/publish"]
        self.assertEqual([line["payload"] for line in sent], [PAYLOAD])
        self.driver.refresh()
        self.assertIn("done", self.by(".status").text)

    def test_a_payload_with_markup_is_shown_as_text(self) -> None:
        self.gated("evil", EVIL)
        server = self.serve()
        self.open(server, "/task/evil")
        self.assertEqual([script.get_attribute("src") for script in self.all("script")], [f"{self.base(server)}/static/console.js"])
        self.assertEqual(self.all("main img"), [])
        self.assertEqual(self.all("pre.payload b"), [])
        text = self.by("pre.payload").text
        self.assertIn("<script>document.title='pwned'</script>", text)
        self.assertIn("</pre><b>bold</b>", text)
        self.assertNotEqual(self.driver.title, "pwned")
        self.assertTrue(self.driver.title.startswith("evil"))

    def test_without_the_token_the_browser_gets_nothing(self) -> None:
        self.gated()
        server = self.serve()
        self.driver.get(f"http://127.0.0.1:{server.server_address[1]}/task/gated")
        self.assertIn("403", self.driver.title)
        self.assertEqual(self.all("pre.payload"), [])
        self.assertEqual(self.approvals(), [])

    def test_a_question_is_answered_in_the_browser(self) -> None:
        store = JsonFileStore(self.store_dir, create=True)

        @longrun.durable(
            store=store, adapters={"send": OutboxAdapter(self.outbox)}, clock=self.clock, approvals=self.source, cancellations=self.source
        )
        def survey(run: longrun.Run) -> Any:
            size = run.ask("size", "How many <b>seats</b>?", choices=[10, 20])
            run.effect("book", "send", {"seats": size})
            return size

        self.assertIs(survey.run("survey").status, Status.AWAITING_INPUT)
        server = self.serve()
        self.open(server, "/task/survey")
        self.assertEqual(self.by(".question").text, "How many <b>seats</b>?")
        self.by('input[name="answer"]').send_keys("20")
        self.by('button[value="answer"]').click()
        self.assertIn("Answered", self.by(".notice").text)
        outcome = survey.run("survey")
        self.assertIs(outcome.status, Status.DONE)
        self.assertEqual(outcome.result, 20)

    def test_a_screenshot_of_the_task_page(self) -> None:
        self.gated()
        server = self.serve()
        self.open(server, "/task/gated")
        os.makedirs(browser_support.ARTIFACTS, exist_ok=True)
        path = os.path.join(browser_support.ARTIFACTS, "console-task-page.png")
        self.driver.set_window_size(1280, 1600)
        self.assertTrue(self.driver.save_screenshot(path))
        with open(path, "rb") as handle:
            data = handle.read()
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertGreater(len(data), 20_000)  # a rendered page, not a blank one


class OperatorBrowserTests(BrowserCase):
    """An operator who keeps the console open: it refreshes itself, searches, filters and pages the
    tasks, sums them up in a band, offers every control through the control root, and has a page
    per worker and per queue. On the JSON-file store; ``SqliteOperatorBrowserTests`` repeats it."""

    def durable_tasks(self, invoices: int, reports: int) -> tuple[str, str, list[str]]:
        """``invoices`` + ``reports`` finished tasks of two functions, one a second apart: the two
        functions' names and the task ids, oldest first."""
        options: dict[str, Any] = dict(store=self.store(), clock=self.clock, approvals=self.source, cancellations=self.source)

        @longrun.durable(**options)
        def invoice(run: longrun.Run, n: int) -> int:
            return int(run.call("total", lambda: n * 2))

        @longrun.durable(**options)
        def report(run: longrun.Run, n: int) -> int:
            return n

        made = []
        for function, prefix, count in ((invoice, "invoice", invoices), (report, "report", reports)):
            for n in range(count):
                task_id = f"{prefix}-{n:03d}"
                self.assertIs(function.run(task_id, n).status, Status.DONE)
                made.append(task_id)
                self.clock.advance(1)
        return invoice.name, report.name, made

    def unsafe(self, task_id: str = "blind") -> Runner:
        """A task whose effect ``one`` is uncertain: applied, then its target could not be observed."""
        blind = OutboxAdapter(self.outbox, raise_after_apply={"one"}, unobservable={"one"})
        runner = self.runner(task_id, [Step("one", "send", {"n": 1})], blind, store=self.store(), approvals=self.source,
                             cancellations=self.source)  # fmt: skip
        with self.assertLogs("longrun", "WARNING"):
            self.assertIs(runner.run().status, Status.UNSAFE_TO_CONTINUE)
        return runner

    def test_the_page_refreshes_itself_and_pauses_while_a_form_is_filled(self) -> None:
        self.gated("first")
        server = self.serve(refresh_s=1.0)
        self.open(server)
        self.by('a[href="/task/first"]')
        self.assertRegex(self.by("#updated").text, r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$")
        self.assertIn("refreshes", self.by("#refresh-state").text)
        self.driver.execute_script("window.longrunMarker = 1")
        self.gated("second")
        self.by('a[href="/task/second"]')  # shown without a click: the page reloaded itself
        self.assertIsNone(self.driver.execute_script("return window.longrunMarker || null"))

        box = self.by('input[name="q"]')
        box.send_keys("sec")
        self.driver.execute_script("window.longrunMarker = 2")
        self.gated("third")
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, WAIT_S).until(lambda driver: "paused" in self.by("#refresh-state").text)
        self.driver.execute_script("document.activeElement.blur()")  # typed in, then left: still a form being filled
        WebDriverWait(self.driver, WAIT_S).until(lambda driver: "paused" in self.by("#refresh-state").text)
        import time

        time.sleep(3.0)  # three refresh periods: the page would have reloaded
        self.assertEqual(self.driver.execute_script("return window.longrunMarker"), 2, "no reload while the form is filled")
        self.assertEqual(self.all('a[href="/task/third"]'), [])
        self.assertEqual(box.get_attribute("value"), "sec")
        box.clear()
        self.driver.execute_script("document.activeElement.blur()")
        self.by('a[href="/task/third"]')  # the form is back as it was: refreshing again
        self.screenshot("refresh")

    def test_search_filters_and_pages_of_fifty_newest_first(self) -> None:
        invoice, report, made = self.durable_tasks(60, 15)
        self.gated("gated")
        newest_first = ["gated", *reversed(made)]
        server = self.serve(refresh_s=0)
        self.open(server)
        self.assertEqual(self.task_ids(), newest_first[:50])
        self.assertIn("1–50 of 76", self.by("nav.pages").text)
        self.assertEqual(self.all('a[rel="prev"]'), [])
        self.screenshot("task-list")
        self.click_and_wait(self.by('a[rel="next"]'))
        self.assertEqual(self.task_ids(), newest_first[50:])
        self.assertIn("51–76 of 76", self.by("nav.pages").text)
        self.assertEqual(self.all('a[rel="next"]'), [])
        self.click_and_wait(self.by('a[rel="prev"]'))
        self.assertEqual(self.task_ids(), newest_first[:50])

        def search(text: str) -> list[str]:
            box = self.by('input[name="q"]')
            box.clear()
            box.send_keys(text)
            self.click_and_wait(self.by("form.filters button"))
            return self.task_ids()

        self.assertEqual(search("invoice-05"), [f"invoice-{n:03d}" for n in range(59, 49, -1)])  # a part of a task id
        self.assertEqual(search("INVOICE-007"), ["invoice-007"])  # any case
        self.assertEqual(search(report.rpartition(":")[2]), [f"report-{n:03d}" for n in range(14, -1, -1)])  # a function's name
        self.assertEqual(search("no-such-task"), [])
        self.assertIn("No tasks match", self.by("main").text)
        search("")

        from selenium.webdriver.support.ui import Select

        Select(self.by('select[name="status"]')).select_by_value("awaiting-approval")
        self.click_and_wait(self.by("form.filters button"))
        self.assertEqual(self.task_ids(), ["gated"])
        Select(self.by('select[name="status"]')).deselect_all()
        Select(self.by('select[name="function"]')).select_by_value(invoice)
        self.click_and_wait(self.by("form.filters button"))
        self.assertEqual(self.task_ids(), [f"invoice-{n:03d}" for n in range(59, 9, -1)])
        self.assertIn("1–50 of 60", self.by("nav.pages").text)
        self.click_and_wait(self.by('a[rel="next"]'))  # a page keeps the filters
        self.assertEqual(self.task_ids(), [f"invoice-{n:03d}" for n in range(9, -1, -1)])
        self.assertEqual(Select(self.by('select[name="function"]')).first_selected_option.get_attribute("value"), invoice)

        since = self.store().load("report-010").state.updated_at
        self.open(server, "/")
        box = self.by('input[name="since"]')
        box.send_keys(datetime.datetime.fromtimestamp(since, datetime.timezone.utc).isoformat())
        self.click_and_wait(self.by("form.filters button"))
        self.assertEqual(self.task_ids(), ["gated", *[f"report-{n:03d}" for n in range(14, 9, -1)]])
        box = self.by('input[name="since"]')
        box.clear()
        box.send_keys("yesterday-ish")
        self.click_and_wait(self.by("form.filters button"))
        self.assertIn("neither a duration", self.by("p.error").text)

        # A task id that long stays on one line; the next action names the store, digests cut short.
        self.open(server, "/")
        cell = self.by("table.tasks td.task")
        self.assertEqual(cell.value_of_css_property("white-space"), "nowrap")
        action = self.by("table.tasks tbody tr td.action").text
        self.assertNotIn("<store>", action)
        self.assertNotRegex(action, r"[0-9a-f]{64}")

    def test_the_summary_band(self) -> None:
        from longrun.cli._common import relative
        from longrun.stores.queue import open_queue

        self.gated("gated-1")
        asked = self.clock.now()
        self.clock.advance(600)
        self.gated("gated-2")
        self.unsafe("blind")
        flaky = OutboxAdapter(self.outbox, fail_transient=1)
        runner = self.runner("flaky", [Step("one", "send", {"n": 1})], flaky, store=self.store(), limits=Limits(max_block_s=0))
        self.assertIs(runner.run().status, Status.RETRY_SCHEDULED)
        self.clock.advance(2 * 3600)
        self.assertIs(self.runner("old", [Step("one", "send", {"n": 1})], store=self.store()).run().status, Status.DONE)
        self.assertIs(self.runner("older", [Step("one", "send", {"n": 2})], store=self.store()).run().status, Status.DONE)
        self.clock.advance(60)
        queue = open_queue(self.store())
        try:
            queue.heartbeat("worker-a", host="host-1", pid=11, state="running", concurrency=4, running=1,
                            functions=["billing:charge"], heartbeat_s=30.0)  # fmt: skip
            queue.heartbeat("worker-b", host="host-2", pid=12, state="stopped", concurrency=2, running=0,
                            functions=["billing:charge"], heartbeat_s=30.0)  # fmt: skip
            queue.enqueue("queued-1", "billing:charge")
            queue.enqueue("queued-2", "billing:charge")
        finally:
            queue.close()
        server = self.serve(refresh_s=0)
        server.console.clock = self.clock.now  # ages and "the last hour" by the tasks' clock
        self.open(server)
        statuses = self.by("section.band .statuses").text
        for expected in ("awaiting-approval 2", "done 2", "unsafe-to-continue 1", "retry-scheduled 1"):
            self.assertIn(expected, statuses)
        pending = self.by("section.band .pending").text.lower()  # the labels are in capitals by the stylesheet
        self.assertIn("2", pending.split())
        self.assertIn(f"oldest requested {relative(asked, self.clock.now())}", pending)
        self.assertEqual(self.by("section.band .failures .figure").text, "0", "the failures are two hours old")
        self.assertEqual(self.by("section.band .queue-depth .figure").text, "2")
        self.assertEqual(self.by("section.band .workers-alive .figure").text, "1 of 2")
        self.screenshot("summary-band")
        server.console.clock = lambda: self.clock.now() - 2 * 3600 + 60  # an hour after the failures
        self.driver.refresh()
        self.assertEqual(self.by("section.band .failures .figure").text, "2")
        self.assertIn("alert", self.by("section.band .failures").get_attribute("class"))
        self.click_and_wait(self.by('section.band a[href="/?status=unsafe-to-continue"]'))
        self.assertEqual(self.task_ids(), ["blind"])

        # The fleet: a page per worker and per queue, reached from the band.
        self.click_and_wait(self.by("section.band .workers-alive a"))
        self.assertIn("worker-a", self.by("main").text)
        self.screenshot("fleet")
        self.click_and_wait(self.by('a[href="/worker/worker-a"]'))
        facts = self.by("dl.facts").text
        self.assertIn("alive", facts)
        self.assertIn("host-1, pid 11", facts)
        self.assertIn("1 running (at its last heartbeat), 0 claimed now, of 4", facts)
        self.screenshot("worker")
        self.click_and_wait(self.by('a[href="/queue/billing%3Acharge"]'))
        self.assertEqual(self.task_ids(), ["queued-1", "queued-2"])
        self.assertIn("2 tasks, 2 due now, 1 of 2 workers alive run it.", self.by("main").text)
        self.screenshot("queue")
        self.open(server, "/worker/nobody")
        self.assertIn("404", self.driver.title)

    def test_every_control_goes_through_the_control_root(self) -> None:
        runner = self.gated("gated")
        server = self.serve(refresh_s=0)
        self.open(server, "/task/gated")
        self.assertEqual(self.by("h1.task-id").value_of_css_property("white-space"), "nowrap")
        self.assertNotIn("<store>", self.by(".next-action").text)
        self.screenshot("task-page")
        # cancel, then reopen: the cancelled task goes on
        self.click_and_wait(self.by('button[value="cancel"]'))
        self.assertIn("Cancellation written", self.by(".notice").text)
        self.assertIsNotNone(self.source.read_cancellation("gated"))
        self.assertIs(runner.run().status, Status.CANCELLED)
        self.driver.refresh()
        self.by('input[name="reason"][placeholder="why it goes on"]').send_keys("the right audience after all")
        self.click_and_wait(self.by('button[value="reopen"]'))
        self.assertIn("Reopen written", self.by(".notice").text)
        self.assertEqual([Approval.from_json(r.body).action for r in self.source.read_approvals("gated")], ["longrun.reopen"])
        self.assertIs(runner.run().status, Status.AWAITING_APPROVAL)
        # approve: the run finishes
        self.driver.refresh()
        self.click_and_wait(self.by('button[value="approve"]'))
        self.assertIn("Approved", self.by(".notice").text)
        self.assertIs(runner.run().status, Status.DONE)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["gated/publish"], 1)
        # resolve an uncertain effect as applied: the run finishes without applying it again
        blind = self.unsafe("blind")
        self.open(server, "/task/blind")
        self.by('input[name="evidence"]').send_keys("line 0 of the outbox holds it")
        self.click_and_wait(self.by('button[value="applied"]'))
        self.assertIn("Resolution written", self.by(".notice").text)
        self.assertIs(blind.run().status, Status.DONE)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["blind/one"], 1)
        self.assertEqual(self.store_approvals("blind"), [], "nothing was written into the store")
        # answer a question
        store = self.store()

        @longrun.durable(store=store, adapters={"send": OutboxAdapter(self.outbox)}, clock=self.clock, approvals=self.source,
                         cancellations=self.source)  # fmt: skip
        def survey(run: longrun.Run) -> Any:
            return run.ask("size", "How many seats?")

        self.assertIs(survey.run("survey").status, Status.AWAITING_INPUT)
        self.open(server, "/task/survey")
        self.by('input[name="answer"]').send_keys("20")
        self.click_and_wait(self.by('button[value="answer"]'))
        self.assertIn("Answered", self.by(".notice").text)
        self.assertEqual(survey.run("survey").result, 20)

    def store_approvals(self, task_id: str = "gated") -> list[Approval]:
        return [Approval.from_json(record.body) for record in self.store().read_approvals(task_id)]

    def test_a_task_page_shows_what_ran_its_family_and_its_last_error(self) -> None:
        options: dict[str, Any] = dict(store=self.store(), clock=self.clock, approvals=self.source, cancellations=self.source)

        @longrun.durable(**options)
        def child(run: longrun.Run, n: int) -> int:
            return n + 1

        @longrun.durable(**options)
        def parent(run: longrun.Run, n: int) -> int:
            return int(run.child("kid", child, n))

        @longrun.durable(**options)
        def broken(run: longrun.Run) -> None:
            raise ValueError("the ledger does not balance")

        self.assertEqual(parent.run("mom", 41).result, 42)
        with self.assertLogs("longrun", "INFO"), self.assertRaises(ValueError):  # recorded, then raised to the caller
            broken.run("broken")
        server = self.serve(refresh_s=0)
        self.open(server, "/task/mom")
        facts = self.by("dl.facts").text
        self.assertIn(parent.name, facts)
        self.assertIn("41", facts)  # the arguments
        self.assertIn("42", facts)  # the result
        self.click_and_wait(self.by('dl.facts a[href="/task/kid"]'))  # a child, linked
        self.click_and_wait(self.by('dl.facts a[href="/task/mom"]'))  # and back to its parent
        self.by("table")  # the timeline
        self.assertIn("Timeline", self.by("main").text)
        self.open(server, "/task/broken")
        facts = self.by("dl.facts").text
        self.assertIn("ValueError", facts)
        self.assertIn("the ledger does not balance", facts)
        self.assertIn("Traceback", facts)
        self.screenshot("last-error")

    def test_run_once_in_the_browser(self) -> None:
        if self.store_kind == "postgres":
            self.skipTest("the task's module names its store by a path; RunOnceTests covers the form")
        module_dir = self.path("modules")
        os.mkdir(module_dir)
        name = "console_browser_once_" + os.path.basename(self.tmp).replace("-", "_")
        store = (f"longrun.SqliteStore({self.path('store.sqlite')!r}, create=True)" if self.store_kind == "sqlite"
                 else f"longrun.JsonFileStore({self.store_dir!r}, create=True)")  # fmt: skip
        with open(os.path.join(module_dir, name + ".py"), "w", encoding="utf-8") as handle:
            handle.write(
                "import longrun\n"
                "from longrun.testing import OutboxAdapter\n"
                f"@longrun.durable(store={store}, adapters={{'send': OutboxAdapter({self.outbox!r})}}, allowed_actions=('send',))\n"
                "def job(run, to):\n"
                "    run.effect('mail', 'send', {'to': to})\n"
                "    return to\n"
            )
        sys.path.insert(0, module_dir)
        self.addCleanup(sys.path.remove, module_dir)
        self.addCleanup(sys.modules.pop, name, None)
        __import__(name).job.start("queued", "ann")
        server = self.serve(refresh_s=0)
        self.open(server, "/task/queued")
        self.assertIn("No live worker runs", self.by("main").text)
        self.click_and_wait(self.by('button[value="run"]'))
        self.assertIn("Ran the task once here", self.by(".notice").text)
        self.assertIn("done", self.by(".status").text)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["queued/mail"], 1)


class SqliteOperatorBrowserTests(OperatorBrowserTests):
    store_kind = "sqlite"


class PostgresOperatorBrowserTests(OperatorBrowserTests):
    store_kind = "postgres"


class ListingTests(ConsoleCase):
    """The list keeps the rows of tasks at rest between renders (``RowCache``): a task that moved
    since shows its new status, and a damaged one on the page shows DAMAGED."""

    def test_a_task_that_moved_since_the_last_render_shows_its_new_status(self) -> None:
        runner = self.gated("gated")
        self.assertIs(self.runner("other", [Step("one", "send", {"n": 1})], store=self.store()).run().status, Status.DONE)
        server = self.serve(refresh_s=0)
        console = server.console
        self.assertIn("status-awaiting-approval", console.task_list({"q": ["gated"]}))
        state = self.store().load("gated").state
        assert state is not None
        request = state.approval_requests["publish"]
        now = self.clock.now()
        self.source_write(Approval.for_request(request, approval_id="a1", approver="alice", granted_at=now, expires_at=now + 3600))
        self.assertIs(runner.run().status, Status.DONE)
        page = console.task_list({"status": ["awaiting-approval"]})
        self.assertIn("No tasks match", page, "the kept row of a task that moved is read again")
        self.assertEqual(console.task_list({"status": ["done"]}).count('<td class="mono task"'), 2)

    def source_write(self, approval: Approval) -> None:
        from longrun.cli._control import open_control_root

        writer = open_control_root(self.control)
        assert writer is not None
        writer.write_approval(approval)

    def test_a_task_damaged_since_the_last_render_shows_damaged_on_its_page(self) -> None:
        if self.store_kind != "json":
            self.skipTest("damages a state file of the JSON-file store")
        self.assertIs(self.runner("t1", [Step("one", "send", {"n": 1})], store=self.store()).run().status, Status.DONE)
        server = self.serve(refresh_s=0)
        self.assertIn("status-done", server.console.task_list({}))
        for name in ("state.json", "state.json.bak"):
            path = os.path.join(self.store_dir, "t1", name)
            if os.path.exists(path):
                with open(path, "r+b") as handle:
                    handle.seek(10)
                    handle.write(b"#####")
        page = server.console.task_list({})
        self.assertIn("status-DAMAGED", page)


class SqliteListingTests(ListingTests):
    store_kind = "sqlite"


class PostgresListingTests(ListingTests):
    store_kind = "postgres"


class ListingScaleTests(ConsoleCase):
    """A page of the list over many tasks. The SQL stores list from their index of task summaries
    where they keep one; the JSON-file store loads every task at the first render and then only
    those that moved (``RowCache``); each render loads the page's tasks. What a page costs is
    measured by ``benchmarks/many_tasks.py``, not here. ``LONGRUN_TEST_SCALE=full`` lists 1,000
    tasks; the default scale 300, which still makes seven pages."""

    TASKS = scale.scaled(300, 1000)

    def test_a_later_page_of_many_tasks_shows_its_own_rows_after_a_task_moved(self) -> None:
        store = self.store()

        @longrun.durable(store=store, clock=self.clock)
        def job(run: longrun.Run, n: int) -> int:
            return n

        for n in range(self.TASKS):
            job.run(f"job-{n:04d}", n)
            self.clock.advance(1)
        server = self.serve(refresh_s=0)
        self.assertEqual(self.request(server, "GET", "/", cookie=server.console.token).status, 200)
        job.run("job-0000", 0)  # a task read again: it ran since (its lease moved)
        page = server.console.task_list({"page": ["3"]})
        self.assertIn(f"101–150 of {self.TASKS}", page)
        self.assertIn(f">job-{self.TASKS - 101:04d}</a>", page)
        self.assertEqual(page.count('<td class="mono task"'), 50)

    def test_a_page_reads_the_index_and_loads_only_its_own_tasks_together(self) -> None:
        from unittest import mock

        store = self.store()

        @longrun.durable(store=store, clock=self.clock)
        def job(run: longrun.Run, n: int) -> int:
            return n

        job.start_many([(f"job-{n:03d}", (n,)) for n in range(120)])
        server = self.serve(refresh_s=0)
        kind = type(server.console.store)
        listed: list[dict[str, Any]] = []
        real_list = kind.list_summaries

        def list_summaries(this: Any, **filters: Any) -> Any:
            listed.append(filters)
            return real_list(this, **filters)

        with mock.patch.object(kind, "load", autospec=True, side_effect=kind.load) as loads, \
                mock.patch.object(kind, "load_many", autospec=True, side_effect=kind.load_many) as together, \
                mock.patch.object(kind, "list_summaries", autospec=True, side_effect=list_summaries):  # fmt: skip
            page = server.console.task_list({"page": ["2"]})
        self.assertIn("51–100 of 120", page)
        self.assertEqual(page.count('<td class="mono task"'), 50)
        # No task loaded but the page's (none waits on a person); the JSON-file store's load_many loads each.
        self.assertEqual(loads.call_count, 50 if self.store_kind == "json" else 0)
        self.assertEqual([len(call.args[1]) for call in together.call_args_list], [50], "the page's tasks, in one read")
        self.assertTrue(all(filters.get("limit") in (0, 50) or filters.get("statuses") for filters in listed), "never every row")


class SqliteListingScaleTests(ListingScaleTests):
    store_kind = "sqlite"
