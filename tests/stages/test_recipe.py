"""Every shipped recipe validates; bad input is a one-line RecipeError."""

import pytest

from cascade.flows.recipes import load_recipe
from cascade.stages.recipe.recipe_file import RECIPES_DIR
from cascade.stages.recipe.schema import Recipe, RecipeError


@pytest.mark.parametrize("path", sorted(RECIPES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_recipe_validates(path):
    recipe = load_recipe(str(path))
    assert isinstance(recipe, Recipe)
    assert recipe.stages, "a recipe without stages does nothing"


def test_tiny_is_the_paper_shape_in_miniature():
    recipe = load_recipe("tiny")
    assert [s.kind for s in recipe.stages] == ["sft_data", "sft", "difficulty", "grpo", "grpo"]
    assert recipe.stage("if_rl").prompts == "difficulty" and recipe.stage("math_rl").prompts is None
    assert set(recipe.domains) == {"math", "instruct"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["stages.sft.stepz=3"],
            "bad override of 'stages.sft.stepz': stages.1.sft.stepz: unknown key; did you mean 'steps'?",
        ),
        (
            ["nonsense=1"],
            "bad override of 'nonsense': nonsense: unknown key; known: compute, domains, engine, eval, gate",
        ),
        (["compute.dtyp=fp32"], "bad override of 'compute.dtyp': compute.dtyp: unknown key; did you mean 'dtype'?"),
        (["domains.math.train_sise=3"], "domains.math.train_sise: unknown key; did you mean 'train_size'?"),
        (
            ["seed=1", "stages.if_rl.lr=0"],
            "bad override of 'stages.if_rl.lr': stages.3.grpo.lr: Input should be greater",
        ),
        (["stages.nope.steps=3"], "no stage named 'nope'"),
        (["stages.sft.steps"], "expected key=value"),
        (["stages.sft.steps=many"], "stages.1.sft.steps: Input should be a valid integer"),
        (["engine.kind=tpu"], "engine.kind: Input should be 'hf' or 'vllm'"),
        (["domains.chess.train_size=3"], "unknown domain(s) ['chess']"),
        (["eval.source=true", "stages.sft.name=source"], "eval.source names the model source's eval row 'source'"),
        (["stages.sft.name=recover-sft"], "stage name(s) ['recover-sft']: recover-<stage> names the gate's recovery"),
        (["domains.instruct.options.generator=ifevl"], "unknown instruct generator 'ifevl'; known: templated, ifeval"),
    ],
)
def test_bad_overrides_are_one_line_errors(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe("tiny", overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_yaml_syntax_error_names_its_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 0\nstages:\n  - kind: sft\n   steps: 3\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(str(path))
    assert str(err.value) == (
        f"{path}: not valid YAML at line 4, column 4: expected <block end>, but found '<block mapping start>' "
        "(while parsing a block collection)"
    )


def test_an_unknown_key_in_a_recipe_file_names_the_nearest_known_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text((RECIPES_DIR / "micro.yaml").read_text().replace("  dtype: fp32", "  dtyp: fp32"))
    with pytest.raises(RecipeError, match=r"typo.yaml: compute.dtyp: unknown key; did you mean 'dtype'\?$"):
        load_recipe(str(path))


def test_override_sets_nested_stage_field():
    recipe = load_recipe("tiny", ["stages.if_rl.lr=1e-4", "seed=7", "domains.math.tolerance=0.1"])
    assert recipe.stage("if_rl").lr == 1e-4 and recipe.seed == 7 and recipe.domains["math"].tolerance == 0.1


def test_unknown_recipe_and_missing_file():
    with pytest.raises(RecipeError, match="unknown recipe 'nope'; shipped recipes: "):
        load_recipe("nope")
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe("/no/such/recipe.yaml")


def test_stage_must_read_an_earlier_dataset():
    raw = {"domains": {"math": {}}, "stages": [{"kind": "sft", "data": "missing"}]}
    with pytest.raises(RecipeError, match="reads data .missing., which no earlier sft_data stage writes"):
        from cascade.stages.recipe.schema import validate_recipe

        validate_recipe(raw)


def test_replacing_the_stage_list_with_a_scalar_is_rejected():
    with pytest.raises(RecipeError, match="stages: Input should be a valid list"):
        load_recipe("tiny", ["stages=3"])


# --- the run form of the `cascade` deployment (flows.recipes.RunRequest) ---


def test_run_form_overrides_apply_to_the_recipe():
    from cascade.flows.recipes import RunRequest, request_recipe

    req = RunRequest(
        recipe="micro", steps=3, lr=1e-4, stages={"sft": {"steps": 5}}, domains=["math"], storage_root="file:///tmp/x"
    )
    recipe = request_recipe(req)
    assert [s.name for s in recipe.stages] == ["sft_data", "sft", "math_rl"]  # difficulty and if_rl: instruct only
    assert list(recipe.domains) == ["math"]
    assert recipe.stage("sft").steps == 5 and recipe.stage("math_rl").steps == 3
    assert recipe.stage("sft").lr == 1e-4 and recipe.stage("math_rl").lr == 1e-4
    assert recipe.storage.root == "file:///tmp/x"


def test_run_form_overrides_a_reward_model_as_every_training_stage():
    """It used to refuse one: "stages.rm: a reward_model stage has no steps or lr"."""
    from cascade.flows.recipes import RunRequest, request_recipe

    recipe = request_recipe(RunRequest(recipe="tiny-rlhf", steps=3, stages={"rm": {"lr": 1e-4}}))
    assert recipe.stage("rm").steps == 3 and recipe.stage("rm").lr == 1e-4
    assert recipe.stage("sft").steps == 3 and recipe.stage("sft").lr == load_recipe("tiny-rlhf").stage("sft").lr
    assert recipe.stage("sft").warmup_steps == 3  # its 100-step default warm-up, cut to the steps the form asks
    assert "reward_model" in RunRequest.model_fields["steps"].description


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"steps": 0}, "greater than or equal to 1"),
        ({"domains": ["poetry"]}, "Input should be"),
        ({"recipe": "nope"}, "Input should be"),
        ({"run_id": "Bad ID"}, "String should match pattern"),
        ({"storage_root": "/no/scheme"}, "String should match pattern"),
    ],
)
def test_run_form_rejects_bad_fields(fields, message):
    from pydantic import ValidationError

    from cascade.flows.recipes import RunRequest

    with pytest.raises(ValidationError, match=message):
        RunRequest(**fields)


@pytest.mark.parametrize(
    "fields", [{"storage_root": "s3://AKIA:pw-7f3k9q@bucket/x"}, {"recipe_uri": "s3://AKIA:pw-7f3k9q@bucket/r.yaml"}]
)
def test_run_form_refuses_credentials_in_urls_without_echoing_them(fields):
    from pydantic import ValidationError

    from cascade.flows.recipes import RunRequest

    with pytest.raises(ValidationError) as e:
        RunRequest(**fields)
    assert f"{next(iter(fields))}: a URL holds credentials" in str(e.value) and "pw-7f3k9q" not in str(e.value)
    if "storage_root" in fields:  # the form's JSON schema refuses it too, before a run (and its parameters) exist
        import jsonschema

        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(fields, RunRequest.model_json_schema())


def test_urls_with_credentials_are_found_and_keys_holding_at_signs_are_not():
    from cascade.artifacts.urls import has_credentials
    from cascade.flows.recipes import RunRequest

    found = ["s3://u:p@b/x", "http://token@host:8000/v1", "see https://a:b@host/x", "git+ssh://git@host/r"]
    found += ["s3://KEY:ab/cd@bucket/x", "http://user:pa/ss@mlflow:5000", "https://u:Zx9/+q@h"]  # '/' in a password
    clean = ["s3://bucket/key@v2", "file:///data/a@b.jsonl", "http://host:8000/v1?u=a@b", "user@host", "x"]
    clean += ["http://host:5000/runs/a@b", "http://127.0.0.1:5000"]  # a port, then a path holding '@'
    assert [u for u in found if not has_credentials(u)] == []
    assert [u for u in clean if has_credentials(u)] == []
    assert RunRequest(storage_root="s3://bucket/key@v2").storage_root == "s3://bucket/key@v2"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"stages": {"nope": {"steps": 2}}}, "no stage named ['nope']"),
        ({"stages": {"sft_data": {"steps": 2}}}, "a sft_data stage has no steps or lr"),
        ({"domains": ["code"]}, "domains: ['code'] not in recipe micro"),
    ],
)
def test_run_form_rejects_fields_the_recipe_lacks(fields, message):
    from cascade.flows.recipes import RunRequest, request_recipe
    from cascade.stages.recipe.schema import RecipeError

    with pytest.raises(RecipeError) as e:
        request_recipe(RunRequest(recipe="micro", **fields))
    assert message in str(e.value)


def test_a_mopd_stage_without_teachers_is_one_line():
    """It used to validate and then crash in random.sample with no prompts to draw."""
    from cascade.stages.recipe.schema import validate_recipe

    raw = load_recipe("micro").model_dump(mode="json")
    raw["stages"].append({"kind": "mopd", "name": "distil"})
    with pytest.raises(RecipeError, match="stage 'distil': a mopd stage needs `teachers`") as e:
        validate_recipe(raw)
    assert "\n" not in str(e.value)


def test_a_warmup_longer_than_the_stage_is_refused_even_as_a_default_but_not_in_a_stored_run():
    """SFT's default warm-up is 100 steps: a 50-step SFT that leaves it would never reach its learning rate.
    A run stored before that rule resumes with the settings it began with."""
    from cascade.stages.recipe.recipe_file import read_recipe_file, resolve_recipe_path
    from cascade.stages.recipe.schema import RecipeError, validate_recipe

    raw = read_recipe_file(resolve_recipe_path("micro"))
    sft = next(s for s in raw["stages"] if s["kind"] == "sft")
    del sft["warmup_steps"]
    sft["steps"] = 50
    with pytest.raises(RecipeError, match=r"warmup_steps 100 \(the default\) is more than steps 50"):
        validate_recipe(raw)
    assert validate_recipe(raw, stored=True).stage("sft").warmup_steps == 100
