"""The web console: its security over plain HTTP, and an operator's work in a real headless browser."""

from __future__ import annotations

from helpers import support

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.parse
from typing import Any

from helpers import browser_support
from helpers.cli_case import CliCase

import longrun
from longrun import Approval, JsonFileStore, Runner, Status, Step
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

    def setUp(self) -> None:
        super().setUp()
        self.control = self.path("control")
        os.mkdir(self.control, 0o755)
        os.chmod(self.control, 0o755)  # whatever the umask: strict mode refuses a group-writable root
        self.source = FileControlSource(self.control, approver_uid=os.geteuid())

    def gated(self, task_id: str = "gated", payload: dict[str, Any] = PAYLOAD) -> Runner:
        steps = [Step("draft", "send", {"text": "hello"}), Step("publish", "send", payload, approval=True)]
        runner = self.runner(task_id, steps, approvals=self.source, cancellations=self.source)
        self.assertIs(runner.run().status, Status.AWAITING_APPROVAL)
        return runner

    def serve(self, **options: Any) -> ConsoleServer:
        options.setdefault("approver", "alice")
        options.setdefault("control_root", self.control)
        server = start_console(JsonFileStore(self.store_dir), self.store_dir, **options)
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
        self.assertNotIn("<script", page.body)
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
    """Every file under ``root`` (but lock files) with its bytes."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if name != "lock":
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


class BrowserTests(ConsoleCase):
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
        self.assertEqual(self.all("script"), [])
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
